"""The untrusted-document reader, and settlement of whatever it lets through, on real
PostgreSQL and SQLite: every document ends in a stored terminal or a coded refusal."""

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
from tasks.constants import MAX_RESULT_FILE_BYTES
from tasks.errors import DocumentInvalidError
from tasks.maintenance.reaper import ReapReport, retry_releases
from tasks.maintenance.trouble import MAX_PASSES, note_failure
from tasks.parse import untrusted
from tasks.settlement.outcome import Outcome, from_result
from tasks.settlement.terminal import settle
from tasks.store.db import session_scope
from tests.support.runs import must_claim, new_run, reserve

# --- the reader alone ---------------------------------------------------------------

ODD_TEXT = st.text(alphabet=st.sampled_from(
    ["a", "\x00", "\ud800", "\udfff", "\u2028", "é", "\"", "\\", "\U0001f600", "\n"]),
    max_size=12)
NUMBERS = st.sampled_from(["0", "-0", "1e400", "-1e400", "1e-400", "9" * 30, "-" + "9" * 19,
                           "9223372036854775807", "9223372036854775808", "NaN", "Infinity",
                           "-Infinity", "1.5", "01", "1e", ".5", "0x10"])


def _leaf_text() -> st.SearchStrategy[str]:
    return st.one_of(NUMBERS, ODD_TEXT.map(json.dumps),
                     st.sampled_from(["true", "false", "null", '"\\u0000"', '"\\ud800"']))


JSONISH = st.recursive(
    _leaf_text(),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.lists(st.tuples(ODD_TEXT.map(json.dumps), inner), max_size=4).map(
            lambda kv: "{" + ",".join(f"{k}:{v}" for k, v in kv) + "}"),
    ),
    max_leaves=20,
)


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
        assert exc.reason in {"size", "values", "encoding", "syntax", "depth", "number",
                              "type"}
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


def _structure(value: Any) -> int:
    """The oracle: each container, comma and colon its JSON text has outside strings."""
    if isinstance(value, list):
        return 1 + max(len(value) - 1, 0) + sum(_structure(v) for v in value)
    if isinstance(value, dict):
        return 1 + len(value) + max(len(value) - 1, 0) + sum(_structure(v)
                                                             for v in value.values())
    return 0


@given(st.one_of(JSONISH, st.binary(max_size=64)))
@settings(max_examples=400, deadline=None)
def test_the_value_bound_changes_nothing_it_lets_through(raw: str | bytes) -> None:
    """The bounded reader accepts and refuses exactly what the unbounded one does, while
    the bound holds; past it the refusal is `values`."""
    def outcome(**bound: int) -> Any:
        try:
            return ("ok", untrusted.parse(raw, max_bytes=4096, **bound))
        except DocumentInvalidError as exc:
            return ("refused", exc.reason)
    unbounded = outcome()
    assert outcome(max_values=10**6) == unbounded
    if unbounded[0] == "ok":
        text = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
        exact = untrusted.structure_count(text)
        assert outcome(max_values=exact) == unbounded
        if exact:
            assert outcome(max_values=exact - 1) == ("refused", "values")


@given(st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                              st.text(alphabet=',:[]{}"\\ab', max_size=8)),
                    lambda inner: st.one_of(st.lists(inner, max_size=5),
                                            st.dictionaries(st.text(max_size=4), inner,
                                                            max_size=5)), max_leaves=30))
@settings(max_examples=300, deadline=None)
def test_the_structure_count_is_exact(value: Any) -> None:
    for text in (json.dumps(value), json.dumps(value, indent=1, ensure_ascii=False)):
        assert untrusted.structure_count(text.encode()) == _structure(value)


def test_a_body_of_many_cheap_values_is_refused_before_it_is_decoded() -> None:
    with pytest.raises(DocumentInvalidError) as info:
        untrusted.parse(b"[" + b"0," * 2_000_000 + b"0]", max_bytes=8 << 20,
                        max_values=200_000)
    assert info.value.reason == "values"
    many_commas = json.dumps({"csv": "a,b:c" * 100_000}).encode()
    assert untrusted.parse(many_commas, max_bytes=8 << 20, max_values=10)["csv"][:5] == "a,b:c"


def test_strings_are_made_storable_not_refused() -> None:
    assert untrusted.parse('{"k\\u0000": ["a\\u0000b", "\\ud800"]}', max_bytes=100) == {
        "k\ufffd": ["a\ufffdb", "?"]}
    nested = "[" * untrusted.MAX_DEPTH + "]" * untrusted.MAX_DEPTH
    assert untrusted.parse(nested, max_bytes=4096) is not None


def test_storable_refuses_values_that_are_not_json() -> None:
    for bad in ({1: "int key"}, {"a": {1, 2}}, [float("nan")], {"x": 2**64}):
        with pytest.raises(DocumentInvalidError):
            untrusted.storable(bad)


# --- through settlement, on both databases --------------------------------------------

def _settle_document(raw: str | bytes) -> tuple[str, str | None, Any]:
    fence = must_claim(new_run())
    outcome = from_result(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str)
                          else raw)
    settle(fence, outcome, reason="ended")
    view = tasks.get_run(fence.run_id)
    return view.status, view.code, view.output


def _check_settled(raw: str | bytes, status: str, code: str | None, output: Any) -> None:
    assert status in {"succeeded", "failed"}
    try:
        body = untrusted.parse(raw, max_bytes=MAX_RESULT_FILE_BYTES)
    except DocumentInvalidError:
        assert (status, code) == ("failed", "OUTPUT_INVALID")
        return
    if status == "succeeded":
        assert output == body["output"]  # stored and read back unchanged
    else:
        assert code in {"OUTPUT_INVALID", "PLAY_ERROR"}


RESULTS = JSONISH.map(lambda inner: '{"status": "succeeded", "output": ' + inner + "}")


@given(st.one_of(RESULTS, JSONISH))
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_result_document_settles_on_postgres(pg_url: str, raw: str) -> None:
    _check_settled(raw, *_settle_document(raw))



@given(st.one_of(RESULTS, JSONISH))
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_result_document_settles_on_sqlite(sqlite_db: str, raw: str) -> None:
    _check_settled(raw, *_settle_document(raw))


def test_an_outcome_the_database_refuses_is_settled_output_invalid(pg_url: str) -> None:
    fence = must_claim(new_run())
    # Bypassing the reader: PostgreSQL's JSONB refuses \u0000 inside a string.
    settled = settle(fence, Outcome("succeeded", output={"bad": "a\x00b"}), reason="ended")
    view = tasks.get_run(fence.run_id)
    assert settled.won
    assert (view.status, view.code, view.output) == ("failed", "OUTPUT_INVALID", None)
    assert "could not be stored" in (view.error or "")


# --- bounded maintenance failures --------------------------------------------------------

def test_a_run_that_keeps_failing_maintenance_is_failed_and_released(pg_url: str) -> None:
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
