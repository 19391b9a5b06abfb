"""The untrusted-document reader, and settlement of whatever it lets through on SQLite
(PostgreSQL: tests/integration/test_untrusted_postgres.py): every document ends in a
stored terminal or a coded refusal."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tasks
from models import CapacityLease, Run
from tasks.errors import DocumentInvalidError
from tasks.maintenance.reaper import ReapReport, retry_releases
from tasks.maintenance.trouble import MAX_PASSES, note_failure
from tasks.parse import untrusted
from tasks.store.db import session_scope
from tests.support.documents import JSONISH, RESULTS, check_settled, settle_document
from tests.support.runs import must_claim, new_run, reserve

# --- the reader alone ---------------------------------------------------------------


def _assert_storable(value: Any, depth: int = 0) -> None:
    assert depth <= untrusted.MAX_DEPTH
    if isinstance(value, str):
        assert "\x00" not in value
        value.encode("utf-8")  # no lone surrogate survives
    elif isinstance(value, float):
        assert value == value and abs(value) != float("inf")
    elif isinstance(value, int) and not isinstance(value, bool):
        assert abs(value) <= untrusted.MAX_INT
    elif isinstance(value, dict):
        for k, v in value.items():
            _assert_storable(k, depth)
            _assert_storable(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _assert_storable(v, depth + 1)


@given(st.one_of(JSONISH, st.binary(max_size=64)))
@settings(max_examples=400, deadline=None)
def test_the_reader_returns_storable_json_or_one_coded_error(raw: str | bytes) -> None:
    try:
        value = untrusted.parse(raw, max_bytes=4096)
    except DocumentInvalidError as exc:
        assert exc.code == "DOCUMENT_INVALID"
        assert exc.reason in {"size", "encoding", "syntax", "depth", "number", "type"}
        return
    _assert_storable(value)
    assert untrusted.parse(json.dumps(value), max_bytes=10**6) == value  # a fixed point


@pytest.mark.parametrize(("raw", "reason"), [
    ("[" * 100_000 + "]" * 100_000, "depth"),
    ("[" * (untrusted.MAX_DEPTH + 1) + "]" * (untrusted.MAX_DEPTH + 1), "depth"),
    ('{"a": 1e400}', "number"),
    ('{"a": NaN}', "number"),
    ("[-Infinity]", "number"),
    ("1" * 25, "number"),
    (b"\xff\xfe", "encoding"),
    ('{"a": 1', "syntax"),
    ("x" * 5000, "size"),
])
def test_hostile_shapes_are_refused_with_their_reason(raw: str | bytes, reason: str) -> None:
    with pytest.raises(DocumentInvalidError) as info:
        untrusted.parse(raw, max_bytes=4096 if reason == "size" else 10**6)
    assert info.value.reason == reason


def test_strings_are_made_storable_not_refused() -> None:
    assert untrusted.parse('{"k\\u0000": ["a\\u0000b", "\\ud800"]}', max_bytes=100) == {
        "k\ufffd": ["a\ufffdb", "?"]}
    nested = "[" * untrusted.MAX_DEPTH + "]" * untrusted.MAX_DEPTH
    assert untrusted.parse(nested, max_bytes=4096) is not None


def test_storable_refuses_values_that_are_not_json() -> None:
    for bad in ({1: "int key"}, {"a": {1, 2}}, [float("nan")], {"x": 2**64}):
        with pytest.raises(DocumentInvalidError):
            untrusted.storable(bad)


# --- through settlement ------------------------------------------------------------

@given(st.one_of(RESULTS, JSONISH))
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_result_document_settles_on_sqlite(sqlite_db: str, raw: str) -> None:
    check_settled(raw, *settle_document(raw))


# --- bounded maintenance failures --------------------------------------------------------

def test_a_run_that_keeps_failing_maintenance_is_failed_and_released(sqlite_db: str) -> None:
    org = f"trouble-{uuid.uuid4().hex[:8]}"
    fence = must_claim(new_run(org))
    lease_id = reserve(fence, org)
    boom = RuntimeError("cannot inspect this one")
    for _ in range(MAX_PASSES - 1):
        assert note_failure(fence.run_id, boom, "the reaper's recovery") is False
    assert tasks.get_run(fence.run_id).status == "running"
    assert note_failure(fence.run_id, boom, "the reaper's recovery") is True
    view = tasks.get_run(fence.run_id)
    assert (view.status, view.code) == ("failed", "RUNTIME_INTERNAL_ERROR")
    assert "cannot inspect this one" in (view.error or "")
    failures = [e for e in tasks.run_events(fence.run_id) if e.kind == "run.maintenance_failed"]
    assert [e.data["pass"] for e in failures] == list(range(1, MAX_PASSES + 1))
    retry_releases(ReapReport())  # the next reaper pass frees the slot
    with session_scope() as s:
        assert s.scalar(sa.select(CapacityLease.state).where(CapacityLease.id == lease_id)) \
            == "released"
        assert s.scalar(sa.select(Run.trouble_count).where(Run.id == fence.run_id)) \
            == MAX_PASSES
