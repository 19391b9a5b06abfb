"""A run's first start on PostgreSQL (tasks/acquisition/first_start.py): one statement opens
attempt 1, its event, the run's new state and the capacity slot, exactly as the general
claim would; anything but a due first start falls through to the general claim; and of
many workers racing for one run, exactly one opens it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from models import Attempt, Run
from tasks.acquisition import capacity
from tasks.acquisition import policy as traffic
from tasks.acquisition.claim import Skip, Skipped
from tasks.acquisition.first_start import first_start
from tasks.acquisition.start import Opened, open_attempt
from tasks.constants import ATTEMPT_ACTIVE, EV_ATTEMPT_STARTED, EV_CAPACITY_OVERRUN, RUNNING
from tasks.db import session_scope
from tasks.settings import Settings, get_settings
from tests.helpers import kinds
from tests.support import close_open_runs, held, new_run, snapshot

ORG_PREFIX = "first-"


def org() -> str:
    return f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module", autouse=True)
def _no_open_runs_left(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)


def settings(**update: Any) -> Settings:
    return get_settings().model_copy(update=update)


def opened(run_id: str, s: Settings | None = None) -> Opened:
    result = open_attempt(run_id, s or get_settings())
    assert isinstance(result, Opened), result
    return result


def test_a_first_start_opens_attempt_one_and_reserves_its_slot(pg_url: str) -> None:
    org_id = org()
    run_id = new_run(org_id)
    got = opened(run_id)
    fence = got.claimed.fence
    assert (fence.run_id, fence.generation, len(fence.lease_token)) == (run_id, 1, 32)
    assert got.claimed.org_id == org_id and got.claimed.resumed is False
    assert got.claimed.input == {} and "def run(ctx, input)" in got.claimed.play_source
    assert got.policy.mode == traffic.NORMAL and got.full is None
    snap = snapshot(run_id)
    assert snap["run"][0] == RUNNING and snap["run"][4] == 1
    assert [(a[0], a[1], a[2]) for a in snap["attempts"]] == [
        (1, fence.lease_token, ATTEMPT_ACTIVE)]
    assert [(x[0], x[1]) for x in snap["leases"]] == [(got.lease_id, capacity.RESERVED)]
    assert kinds(run_id)[-1] == EV_ATTEMPT_STARTED
    assert held(org_id) == 1


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
    cancelled, early, tried = new_run(org()), new_run(org()), new_run(org())
    with session_scope() as session:
        session.execute(sa.update(Run).where(Run.id == cancelled)
                        .values(cancel_requested_at=sa.func.now()))
        session.execute(sa.update(Run).where(Run.id == early).values(
            deferred_until=sa.func.now() + sa.text("interval '1 hour'")))
    opened(tried)
    with session_scope() as session:  # attempt 1 ended: the next start is generation 2
        session.execute(sa.update(Attempt).where(Attempt.run_id == tried)
                        .values(state="ended", end_reason="test"))
    for run_id in (cancelled, early, tried, "no-such-run"):
        before = snapshot(run_id) if run_id != "no-such-run" else None
        assert first_start(run_id, **args) is None  # type: ignore[arg-type]
        if before is not None:
            assert snapshot(run_id) == before  # matched nothing, wrote nothing
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
    assert snapshot(second)["attempts"][0][2] == ATTEMPT_ACTIVE  # claimed, to be deferred
    assert held(org_id) == 1


def test_observe_mode_admits_past_the_limit_and_logs_the_overrun_after_the_start(
        pg_url: str) -> None:
    org_id = org()
    capacity.set_limit(org_id, 1)
    opened(new_run(org_id))
    run_id = new_run(org_id)
    got = opened(run_id, settings(capacity_mode="observe"))
    assert got.lease_id is not None and got.full is None
    assert kinds(run_id)[-2:] == [EV_ATTEMPT_STARTED, EV_CAPACITY_OVERRUN]
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
