"""Traffic policy input is checked when set, and a bad stored row is never applied.

Rows are inserted directly (as a hand edit or an older build could) to prove that
`policy.current` ignores them with a log line: a `throttle nan` row must not stop
the fleet's sandbox starts.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import tasks
from models import TrafficPolicy, db_now
from tasks.acquisition import permits, policy
from tasks.errors import PolicyInvalidError
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tests.support.paths import HELLO
from tests.support.stack import Worker

DAY = 86400.0


@pytest.fixture
def rows(pg_url: str) -> Iterator[list[int]]:
    """Ids of policy rows a test writes; deleted afterwards so no later test sees them."""
    ids: list[int] = []
    yield ids
    with session_scope() as session:
        session.execute(sa.delete(TrafficPolicy).where(
            sa.or_(TrafficPolicy.id.in_(ids), TrafficPolicy.reason.like("test-validate%"))))


def insert(ids: list[int], mode: str, rate: float | None = None,
           expires_in_s: float | None = 600.0) -> int:
    with session_scope() as session:
        row = TrafficPolicy(mode=mode, starts_per_minute=rate, reason="test-validate",
                            expires_at=None if expires_in_s is None else db_now(expires_in_s))
        session.add(row)
        session.flush()
        ids.append(row.id)
        return row.id


def row_count() -> int:
    with session_scope() as session:
        return int(session.scalar(sa.select(sa.func.count()).select_from(TrafficPolicy)) or 0)


@pytest.mark.parametrize(("mode", "kwargs"), [
    (policy.THROTTLE, {"starts_per_minute": float("nan"), "for_s": 60}),
    (policy.THROTTLE, {"starts_per_minute": float("inf"), "for_s": 60}),
    (policy.THROTTLE, {"starts_per_minute": float("1e400"), "for_s": 60}),
    (policy.THROTTLE, {"starts_per_minute": -1, "for_s": 60}),
    (policy.THROTTLE, {"starts_per_minute": 0, "for_s": 60}),
    (policy.THROTTLE, {"starts_per_minute": 1_000_001, "for_s": 60}),
    (policy.THROTTLE, {"starts_per_minute": True, "for_s": 60}),
    (policy.THROTTLE, {"starts_per_minute": "5", "for_s": 60}),
    (policy.THROTTLE, {"starts_per_minute": None, "for_s": 60}),
    (policy.THROTTLE, {"starts_per_minute": 10**400, "for_s": 60}),
    (policy.HOLD, {"for_s": float("nan")}),
    (policy.HOLD, {"for_s": float("inf")}),
    (policy.HOLD, {"for_s": -1}),
    (policy.HOLD, {"for_s": 0}),
    (policy.HOLD, {"for_s": 366 * DAY}),
    (policy.HOLD, {"for_s": None}),
    (policy.HOLD, {"for_s": "10m"}),
    (policy.HOLD, {"for_s": 60, "reason": "a\x00b"}),
    (policy.HOLD, {"for_s": 60, "reason": "\ud800"}),
    (policy.HOLD, {"for_s": 60, "reason": "r" * 1001}),
    (policy.NORMAL, {"for_s": float("nan")}),
    ("hold", {"for_s": 60}),
])
def test_set_policy_refuses_bad_values_and_stores_nothing(pg_url: str, mode: str,
                                                          kwargs: dict[str, Any]) -> None:
    before = row_count()
    with pytest.raises(PolicyInvalidError) as err:
        policy.set_policy(mode, **kwargs)
    assert err.value.code == "POLICY_INVALID"
    assert row_count() == before


def test_set_policy_still_stores_good_values(rows: list[int]) -> None:
    try:
        got = policy.set_policy(policy.THROTTLE, for_s=60, starts_per_minute=1_000_000,
                                reason="test-validate good")
        assert (got.mode, got.starts_per_minute) == (policy.THROTTLE, 1_000_000)
        assert policy.set_policy(policy.HOLD, for_s=365 * DAY,
                                 reason="test-validate year").mode == policy.HOLD
    finally:
        policy.set_policy(policy.NORMAL, for_s=None)
    assert policy.read().mode == policy.NORMAL


BAD_ROWS = [
    pytest.param(policy.THROTTLE, float("nan"), 600.0, id="throttle-nan"),
    pytest.param(policy.THROTTLE, float("inf"), 600.0, id="throttle-inf"),
    pytest.param(policy.THROTTLE, -5.0, 600.0, id="throttle-negative"),
    pytest.param(policy.THROTTLE, 0.0, 600.0, id="throttle-zero"),
    pytest.param(policy.THROTTLE, None, 600.0, id="throttle-no-rate"),
    pytest.param(policy.THROTTLE, 2e6, 600.0, id="throttle-too-fast"),
    pytest.param(policy.THROTTLE, 30.0, None, id="throttle-for-ever"),
    pytest.param(policy.HOLD, None, None, id="hold-for-ever"),
    pytest.param(policy.HOLD, None, 100 * 365 * DAY, id="hold-a-century"),
    pytest.param("hold_everything", None, 600.0, id="unknown-mode"),
]


@pytest.mark.parametrize(("mode", "rate", "expires_in_s"), BAD_ROWS)
def test_an_invalid_stored_row_is_ignored_with_a_log_line(
        rows: list[int], caplog: pytest.LogCaptureFixture, mode: str, rate: float | None,
        expires_in_s: float | None) -> None:
    row_id = insert(rows, mode, rate, expires_in_s)
    with caplog.at_level(logging.WARNING, logger="playrun.policy"):
        assert policy.read() == policy.Policy(policy.NORMAL)
    ignored = [r for r in caplog.records if f"row {row_id}" in r.getMessage()]
    assert len(ignored) == 1 and "ignoring invalid traffic policy" in ignored[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="playrun.policy"):
        assert policy.read().mode == policy.NORMAL
    assert not caplog.records, "the same bad row is logged once per process, not per claim"


def test_a_bad_row_hides_nothing_older(rows: list[int]) -> None:
    insert(rows, policy.THROTTLE, 120.0)
    insert(rows, policy.THROTTLE, float("nan"))
    got = policy.read()
    assert (got.mode, got.starts_per_minute) == (policy.THROTTLE, 120.0)
    insert(rows, policy.NORMAL, None, None)
    insert(rows, policy.HOLD, None, None)
    assert policy.read() == policy.Policy(policy.NORMAL)


def test_a_sound_row_is_still_applied(rows: list[int]) -> None:
    insert(rows, policy.HOLD, None, 600.0)
    assert policy.read().mode == policy.HOLD
    insert(rows, policy.THROTTLE, 0.5, 600.0)
    got = policy.read()
    assert (got.mode, got.starts_per_minute) == (policy.THROTTLE, 0.5)


def test_a_throttle_nan_row_does_not_break_the_start_permit(rows: list[int],
                                                            redis_url: str) -> None:
    insert(rows, policy.THROTTLE, float("nan"))
    decision = permits.acquire(f"validate-{uuid.uuid4().hex[:6]}", policy.read(),
                               get_settings())
    assert decision.granted and decision.rate == get_settings().start_rate_initial_per_min


@pytest.mark.slow
def test_runs_still_start_with_a_throttle_nan_row_in_the_table(rows: list[int],
                                                               worker: Worker) -> None:
    insert(rows, policy.THROTTLE, float("nan"), 3600.0)
    handle = tasks.submit_run(HELLO, input={"name": "Nan"}, org_id=f"val-{uuid.uuid4().hex[:6]}")
    result = handle.wait(timeout=60)
    assert result.status == "succeeded", (result, worker.output()[-2000:])
