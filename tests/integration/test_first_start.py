"""A run's first start on PostgreSQL (tasks/acquisition/first_start.py): one statement opens
attempt 1, its event, the run's new state and the capacity slot, exactly as the general
claim would; anything but a due first start falls through to the general claim; and of
many workers racing for one run, exactly one opens it.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa

from models import Attempt, CapacityLease, Run, RunEvent, TrafficPolicy, db_now
from tasks.acquisition import capacity, start
from tasks.acquisition import policy as traffic
from tasks.acquisition.claim import Claimed, Skip, Skipped, claim
from tasks.acquisition.first_start import FirstStart, first_start
from tasks.acquisition.start import Opened, open_attempt
from tasks.constants import AttemptState, EventKind, RunStatus
from tasks.settings import Settings, get_settings
from tasks.store.db import session_scope
from tests.support.helpers import kinds
from tests.support.runs import closes_open_runs, held, new_run, org_namer, snapshot

ORG_PREFIX = "first-"

org = org_namer(ORG_PREFIX)
_no_open_runs_left = closes_open_runs(ORG_PREFIX)


def settings(**update: Any) -> Settings:
    return get_settings().model_copy(update=update)


def opened(run_id: str, s: Settings | None = None) -> Opened:
    result = open_attempt(run_id, s or get_settings())
    assert isinstance(result, Opened), result
    return result


@pytest.fixture
def fast_path(monkeypatch: pytest.MonkeyPatch) -> list[FirstStart | None]:
    """What each first_start call open_attempt made returned (None: it fell through)."""
    seen: list[FirstStart | None] = []

    def spy(*args: Any, **kwargs: Any) -> FirstStart | None:
        seen.append(first_start(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(start, "first_start", spy)
    return seen


def test_a_first_start_opens_attempt_one_and_reserves_its_slot(
        pg_url: str, fast_path: list[FirstStart | None]) -> None:
    org_id = org()
    run_id = new_run(org_id)
    got = opened(run_id)
    assert len(fast_path) == 1 and fast_path[0] is not None  # the one statement did it
    fence = got.claimed.fence
    assert (fence.run_id, fence.generation, len(fence.lease_token)) == (run_id, 1, 32)
    assert got.claimed.org_id == org_id and got.claimed.resumed is False
    assert got.claimed.input == {} and "def run(ctx, input)" in got.claimed.play_source
    assert got.policy.mode == traffic.NORMAL and got.full is None
    snap = snapshot(run_id)
    assert snap["run"][0] == RunStatus.RUNNING and snap["run"][4] == 1
    assert [(a[0], a[1], a[2]) for a in snap["attempts"]] == [
        (1, fence.lease_token, AttemptState.ACTIVE)]
    assert [(x[0], x[1]) for x in snap["leases"]] == [(got.lease_id, capacity.RESERVED)]
    assert kinds(run_id)[-1] == EventKind.ATTEMPT_STARTED
    assert held(org_id) == 1


_VOLATILE = {"id", "lease_token", "holder_token", "worker_id", "run_id", "org_id",
             "idempotency_key", "play_digest"}


def _rows(run_id: str) -> dict[str, Any]:
    """Every column of the run's rows a start writes; ids, tokens and clocks only as
    present or not (they differ between any two starts)."""
    def value(row: Any, key: str) -> Any:
        v = getattr(row, key)
        return v is not None if key in _VOLATILE or isinstance(v, datetime) else v

    def plain(row: Any) -> dict[str, Any]:
        return {c.key: value(row, c.key) for c in sa.inspect(row).mapper.column_attrs}

    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        return {
            "run": plain(run),
            "attempts": [plain(a) for a in session.scalars(
                sa.select(Attempt).where(Attempt.run_id == run_id))],
            "events": [(e.kind, e.generation, e.data) for e in session.scalars(
                sa.select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.id))],
            "leases": [plain(x) for x in session.scalars(
                sa.select(CapacityLease).where(CapacityLease.run_id == run_id))],
        }


def test_the_statement_writes_what_the_general_transaction_writes(
        pg_url: str, fast_path: list[FirstStart | None]) -> None:
    """One new run through the statement, one through the general claim and reservation:
    the same rows, column for column (ids, tokens and clocks aside)."""
    s = get_settings()
    fast_run, general_run = new_run(org()), new_run(org())
    got = opened(fast_run)
    assert fast_path == [fast_path[0]] and fast_path[0] is not None
    with session_scope(durable=False) as session:
        claimed = claim(session, general_run, worker_id="w", lease_seconds=s.lease_seconds)
        assert isinstance(claimed, Claimed)
        reservation = capacity.reserve(session, claimed.fence, claimed.org_id, s)
    fast, general = _rows(fast_run), _rows(general_run)
    assert fast == general
    assert fast["leases"][0]["state"] == capacity.RESERVED and got.lease_id != \
        reservation.lease_id


def test_the_input_comes_back_as_it_was_stored(pg_url: str) -> None:
    run_id = new_run(org())
    value = {"text": "ünïcode", "n": 2**60, "x": 1.5, "list": [None, True, "s"]}
    with session_scope() as session:
        session.execute(sa.update(Run).where(Run.id == run_id).values(input=value))
    assert opened(run_id).claimed.input == value


def test_a_second_delivery_falls_through_and_sees_the_attempt(pg_url: str) -> None:
    run_id = new_run(org())
    opened(run_id)
    assert open_attempt(run_id, get_settings()) == Skipped(Skip.ACTIVE)
    assert len(snapshot(run_id)["attempts"]) == 1


def test_anything_but_a_due_first_start_is_left_to_the_general_claim(pg_url: str) -> None:
    s = get_settings()
    args = dict(worker_id="w", lease_seconds=30, reserve=True, org_capacity=10, observe=False,
                reservation_ttl_s=30)
    cancelled, early, tried, ended = new_run(org()), new_run(org()), new_run(org()), \
        new_run(org())
    with session_scope() as session:
        session.execute(sa.update(Run).where(Run.id == cancelled)
                        .values(cancel_requested_at=sa.func.now()))
        # Ended before any attempt (as a forced settlement ends it), with no cancel asked.
        session.execute(sa.update(Run).where(Run.id == ended).values(
            status="failed", code="SANDBOX_START_FAILED", finished_at=sa.func.now()))
        session.execute(sa.update(Run).where(Run.id == early).values(
            deferred_until=sa.func.now() + sa.text("interval '1 hour'")))
    opened(tried)
    with session_scope() as session:  # attempt 1 ended: the next start is generation 2
        session.execute(sa.update(Attempt).where(Attempt.run_id == tried)
                        .values(state="ended", end_reason="test"))
    for run_id in (cancelled, early, tried, ended, "no-such-run"):
        before = snapshot(run_id) if run_id != "no-such-run" else None
        assert first_start(run_id, **args) is None  # type: ignore[arg-type]
        if before is not None:
            assert snapshot(run_id) == before  # matched nothing, wrote nothing
    assert open_attempt(ended, s) == Skipped(Skip.TERMINAL)
    assert open_attempt(cancelled, s) == Skipped(Skip.CANCEL)
    assert open_attempt(early, s) == Skipped(Skip.NOT_DUE)
    assert open_attempt("no-such-run", s) == Skipped(Skip.NOT_FOUND)
    assert opened(tried).claimed.fence.generation == 2


def test_a_hold_claims_but_reserves_nothing(pg_url: str) -> None:
    org_id = org()
    run_id = new_run(org_id)
    traffic.set_policy(traffic.HOLD, for_s=30, reason="test_first_start")
    try:
        got = opened(run_id)
    finally:
        traffic.set_policy(traffic.NORMAL, for_s=None)
    assert got.policy.mode == traffic.HOLD and got.lease_id is None and got.full is None
    assert snapshot(run_id)["leases"] == [] and held(org_id) == 0


def test_a_full_org_claims_and_says_full(pg_url: str) -> None:
    org_id = org()
    capacity.set_limit(org_id, 1)
    first, second = new_run(org_id), new_run(org_id)
    assert opened(first).lease_id is not None
    got = opened(second)
    assert got.lease_id is None and got.full is not None
    assert got.full.code == "SANDBOX_CAPACITY_EXCEEDED"
    assert snapshot(second)["attempts"][0][2] == AttemptState.ACTIVE  # claimed, to be deferred
    assert held(org_id) == 1


def test_observe_mode_admits_past_the_limit_and_logs_the_overrun_after_the_start(
        pg_url: str) -> None:
    org_id = org()
    capacity.set_limit(org_id, 1)
    opened(new_run(org_id))
    run_id = new_run(org_id)
    got = opened(run_id, settings(capacity_mode="observe"))
    assert got.lease_id is not None and got.full is None
    assert kinds(run_id)[-2:] == [EventKind.ATTEMPT_STARTED, EventKind.CAPACITY_OVERRUN]
    assert held(org_id) == 2


def test_of_many_racing_workers_exactly_one_opens_the_run(pg_url: str) -> None:
    org_id = org()
    runs = [new_run(org_id) for _ in range(5)]
    for run_id in runs:
        barrier = threading.Barrier(8)
        results: list[Opened | Skipped] = []

        def race(rid: str = run_id, b: threading.Barrier = barrier,
                 out: list[Opened | Skipped] = results) -> None:
            b.wait()
            out.append(open_attempt(rid, get_settings()))

        threads = [threading.Thread(target=race) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        winners = [r for r in results if isinstance(r, Opened)]
        assert len(results) == 8 and len(winners) == 1, results
        assert all(r.reason in (Skip.LOCKED, Skip.ACTIVE) for r in results
                   if isinstance(r, Skipped))
        snap = snapshot(run_id)
        assert [a[1] for a in snap["attempts"]] == [winners[0].claimed.fence.lease_token]
        assert len(snap["leases"]) == 1
    assert held(org_id) == len(runs)


def test_a_hold_row_not_in_force_still_reserves_the_slot(
        pg_url: str, fast_path: list[FirstStart | None]) -> None:
    """The statement takes no slot while any unexpired row is a hold; when that row is not
    the policy in force (here unsound: an expiry two years away), the start reserves apart."""
    org_id = org()
    run_id = new_run(org_id)
    with session_scope() as session:
        session.add(TrafficPolicy(mode=traffic.HOLD, reason="test_first_start unsound",
                                  expires_at=db_now(2 * 365 * 86400)))
    try:
        got = opened(run_id)
    finally:
        with session_scope() as session:
            session.execute(sa.delete(TrafficPolicy).where(
                TrafficPolicy.reason == "test_first_start unsound"))
    assert fast_path[0] is not None and fast_path[0].reserved is False
    assert got.policy.mode == traffic.NORMAL and got.lease_id is not None and got.full is None
    assert [(x[0], x[1]) for x in snapshot(run_id)["leases"]] == [(got.lease_id,
                                                                   capacity.RESERVED)]
    assert held(org_id) == 1
