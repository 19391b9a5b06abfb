"""Fencing under real concurrency on PostgreSQL (docs/decisions/0002-fencing.md).

Threads and processes race the same SQL rows: one claim wins, a stale fence writes
nothing, the first terminal write wins and never changes. A hypothesis test drives
interleavings of claims, lease expiry, reaper adoption, settlements and renewals
(tests/test_fencing_interleavings.py).

Processes are started with the `spawn` method (never fork a process that holds pooled
connections); each child opens its own engine. This module must not import
tests.conftest at import time, since spawned children import it to find their target.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from models import Attempt, Run, db_now
from tasks.acquisition import capacity
from tasks.acquisition.claim import Claimed, Skipped
from tasks.acquisition.sandbox import note_requested, record_live
from tasks.constants import RunStatus
from tasks.errors import FenceLostError
from tasks.execution.launch import record_launch
from tasks.maintenance.reaper import _adopt
from tasks.sandbox import SandboxRef
from tasks.settings import get_settings
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle, settle_launch, settle_unattended
from tasks.store.db import session_scope
from tasks.store.fence import Fence, hold, renew
from tests.support.runs import (
    ORG_PREFIX,
    TERMINAL_EVENTS,
    claim_now,
    close_open_runs,
    event_kinds,
    is_current,
    launched,
    must_claim,
    new_run,
    outcome_of,
    reserve,
    snapshot,
    supersede,
    wait_lease_expired,
)

ROOT = Path(__file__).resolve().parents[2]
NOOP = ROOT / "examples" / "plays" / "noop.py"
SPAWN = mp.get_context("spawn")


# --- helpers ----------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _no_open_runs_left(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)


def _settled_tuple(fence: Fence, outcome: Outcome) -> tuple[Any, ...]:
    result = settle(fence, outcome, reason="test")
    o = result.outcome
    return (result.won, o.status, o.code, o.error, o.output)


# --- children (spawned processes) -----------------------------------------------------------

def _claim_child(run_ids: list[str], threads: int, barrier: Any, out: Any) -> None:
    """Race claim() on every run id from `threads` threads, in lockstep with the parent."""
    results: list[tuple[str, str, int | None]] = []
    lock = threading.Lock()

    def one(run_id: str, name: str) -> None:
        barrier.wait(timeout=60)
        r = claim_now(run_id, name)
        with lock:
            results.append((run_id, "claimed" if isinstance(r, Claimed) else r.reason,
                            r.fence.generation if isinstance(r, Claimed) else None))

    try:
        for run_id in run_ids:
            ts = [threading.Thread(target=one, args=(run_id, f"p{os.getpid()}-t{i}"))
                  for i in range(threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        out.put(("ok", results))
    except BaseException as exc:  # report to the parent instead of hanging it
        out.put(("error", repr(exc)))


def _settle_child(fence: tuple[str, int, str], outcomes: list[tuple[Any, ...]], barrier: Any,
                  out: Any) -> None:
    f = Fence(*fence)
    results: list[tuple[Any, ...]] = []
    lock = threading.Lock()

    def one(o: tuple[Any, ...]) -> None:
        barrier.wait(timeout=60)
        r = _settled_tuple(f, Outcome(*o))
        with lock:
            results.append(r)

    try:
        ts = [threading.Thread(target=one, args=(o,)) for o in outcomes]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        out.put(("ok", results))
    except BaseException as exc:
        out.put(("error", repr(exc)))


def _collect(procs: list[Any], out: Any, timeout: float = 60.0) -> list[Any]:
    found: list[Any] = []
    for _ in procs:
        status, payload = out.get(timeout=timeout)
        assert status == "ok", payload
        found.extend(payload)
    for p in procs:
        p.join(timeout=timeout)
        assert p.exitcode == 0, f"child exited with {p.exitcode}"
    return found


# --- claims -------------------------------------------------------------------------------

def test_one_claim_wins_among_threads_and_processes(pg_url: str) -> None:
    """4 processes x 4 threads + 8 threads here race claim() on each of 3 runs."""
    procs_n, child_threads, local_threads = 4, 4, 8
    run_ids = [new_run() for _ in range(3)]
    barrier = SPAWN.Barrier(procs_n * child_threads + local_threads)
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=_claim_child, args=(run_ids, child_threads, barrier, out))
             for _ in range(procs_n)]
    for p in procs:
        p.start()
    local: list[tuple[str, str, int | None]] = []
    lock = threading.Lock()

    def one(run_id: str, i: int) -> None:
        barrier.wait(timeout=60)
        r = claim_now(run_id, f"local-{i}")
        with lock:
            local.append((run_id, "claimed" if isinstance(r, Claimed) else r.reason,
                          r.fence.generation if isinstance(r, Claimed) else None))

    try:
        for run_id in run_ids:
            with ThreadPoolExecutor(local_threads) as pool:
                list(pool.map(lambda i, rid=run_id: one(rid, i), range(local_threads)))
        results = local + _collect(procs, out)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
    for run_id in run_ids:
        mine = [r for r in results if r[0] == run_id]
        assert len(mine) == procs_n * child_threads + local_threads
        claimed = [r for r in mine if r[1] == "claimed"]
        assert len(claimed) == 1, mine
        assert claimed[0][2] == 1
        assert {r[1] for r in mine if r[1] != "claimed"} <= {"locked", "active"}
        with session_scope() as session:
            run = session.get(Run, run_id)
            assert run is not None and run.current_generation == 1 and run.status == "running"
            assert session.scalar(sa.select(sa.func.count()).where(
                Attempt.run_id == run_id)) == 1
        assert event_kinds(run_id).count("attempt.started") == 1
    # Once decided, a redelivery still opens nothing.
    assert claim_now(run_ids[0]) == Skipped("active")


def _race_claims(run_id: str, threads: int) -> list[Claimed | Skipped]:
    barrier = threading.Barrier(threads)

    def one(i: int) -> Claimed | Skipped:
        barrier.wait(timeout=30)
        return claim_now(run_id, f"racer-{i}")

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(threads)))


def _defer_due_now(fence: Fence) -> None:
    """Park the attempt the way a deferral does, due at once."""
    with session_scope() as session:
        session.execute(sa.update(Attempt).where(
            Attempt.run_id == fence.run_id, Attempt.generation == fence.generation)
            .values(state="deferred", lease_expires_at=db_now()))
        session.execute(sa.update(Run).where(Run.id == fence.run_id)
                        .values(status="queued", deferred_until=db_now()))


@pytest.mark.parametrize("path", ["new_attempt", "resume"])
def test_a_claim_that_loses_by_a_hair_opens_nothing(pg_url: str, path: str) -> None:
    """A claim whose statement began just before the winner committed must see the
    winner's attempt, not the attempt as of its own snapshot (regression: it opened
    generation 2 beside generation 1). Many small races make the hair-width window hit."""
    for _ in range(60):
        run_id = new_run()
        first: Fence | None = None
        if path == "resume":
            first = must_claim(run_id)
            _defer_due_now(first)
        results = _race_claims(run_id, 6)
        won = [r for r in results if isinstance(r, Claimed)]
        assert len(won) == 1, results
        assert won[0].fence.generation == 1 and won[0].resumed == (path == "resume")
        assert {r.reason for r in results if isinstance(r, Skipped)} <= {"locked", "active"}
        assert is_current(won[0].fence)
        with session_scope() as session:
            assert session.scalar(sa.select(sa.func.count()).where(
                Attempt.run_id == run_id)) == 1
        assert event_kinds(run_id).count("attempt.started") == 1


def test_claim_skips_terminal_and_cancelled_runs(pg_url: str) -> None:
    done = new_run()
    fence = must_claim(done)
    assert settle(fence, Outcome(RunStatus.SUCCEEDED, output=1), reason="ended").won
    assert claim_now(done) == Skipped("terminal")
    cancelled = new_run()
    with session_scope() as session:
        session.execute(sa.update(Run).where(Run.id == cancelled)
                        .values(cancel_requested_at=db_now()))
    assert claim_now(cancelled) == Skipped("cancel")
    assert claim_now(uuid.uuid4().hex) == Skipped("not_found")


# --- stale fences ---------------------------------------------------------------------------

STALE_KINDS = ["wrong_token", "old_generation", "expired_lease", "adopted_by_reaper"]


@pytest.mark.parametrize("kind", STALE_KINDS)
def test_a_stale_fence_cannot_write(pg_url: str, kind: str) -> None:
    run_id = new_run()
    short = kind in ("expired_lease", "adopted_by_reaper")
    first = must_claim(run_id, "A", lease_seconds=0.3 if short else 30.0)
    current: Fence | None = first
    if kind == "wrong_token":
        stale = Fence(run_id, first.generation, "0" * 32)
    elif kind == "old_generation":
        supersede(run_id)
        current = must_claim(run_id, "B")
        assert current.generation == 2
        stale = first
    elif kind == "expired_lease":
        wait_lease_expired(first)
        stale, current = first, None
    else:
        wait_lease_expired(first)
        adopted = _adopt(run_id, get_settings())
        assert adopted is not None
        current = adopted.fence
        assert current.generation == first.generation and current.lease_token != first.lease_token
        stale = first
    assert not is_current(stale)
    before = snapshot(run_id)
    view_before = outcome_of(run_id)

    with pytest.raises(FenceLostError), session_scope() as session:
        hold(session, stale)
    with pytest.raises(FenceLostError):
        settle(stale, Outcome(RunStatus.SUCCEEDED, output={"stale": True}), reason="ended")
    with pytest.raises(FenceLostError), session_scope() as session:
        hold(session, stale)
        renew(session, stale, 3600)
    with pytest.raises(FenceLostError), session_scope() as session:
        hold(session, stale)
        capacity.reserve(session, stale, "org-stale", get_settings())
    with pytest.raises(FenceLostError):
        note_requested(stale, "local")  # the one-statement fenced event
    assert snapshot(run_id) == before, "a stale fence changed something"
    assert "sandbox.requested" not in event_kinds(run_id)
    assert outcome_of(run_id) == view_before

    # A late sandbox report: recorded for cleanup only, never live, nothing else touched.
    ghost = SandboxRef("local", f"lsb-{uuid.uuid4().hex[:16]}", {}, time.time())
    with pytest.raises(FenceLostError):
        record_live(stale, ghost)
    after = snapshot(run_id)
    assert after["resources"] == [(ghost.sandbox_id, "cleanup")]
    assert {k: v for k, v in after.items() if k != "resources"} == \
        {k: v for k, v in before.items() if k != "resources"}
    assert "sandbox.live" not in event_kinds(run_id)
    # The same through the launch record (one statement on PostgreSQL when it can write).
    late = SandboxRef("local", f"lsb-{uuid.uuid4().hex[:16]}", {}, time.time())
    with pytest.raises(FenceLostError):
        record_launch(stale, get_settings(), late)
    assert sorted(snapshot(run_id)["resources"]) == sorted(
        [(ghost.sandbox_id, "cleanup"), (late.sandbox_id, "cleanup")])
    assert "sandbox.live" not in event_kinds(run_id)

    if current is not None:
        # The real holder still writes: the fence is selective, not broken.
        note_requested(current, "local")
        assert event_kinds(run_id).count("sandbox.requested") == 1
        assert settle(current, Outcome(RunStatus.FAILED, "PLAY_ERROR", "x"), reason="ended").won
        won = outcome_of(run_id)
        assert won.status == RunStatus.FAILED
        # Now the stale writer is told what won, and still writes nothing.
        late = settle(stale, Outcome(RunStatus.SUCCEEDED, output={"stale": True}), reason="ended")
        assert not late.won and late.outcome == won
        assert outcome_of(run_id) == won


# --- first write wins -----------------------------------------------------------------------

def _outcomes(prefix: str, n: int) -> list[tuple[Any, ...]]:
    kinds = [
        lambda i: (RunStatus.SUCCEEDED, None, None, {"writer": f"{prefix}{i}"}),
        lambda i: (RunStatus.FAILED, "PLAY_ERROR", f"writer {prefix}{i} failed", None),
        lambda i: ("cancelled", "CANCELLED", f"writer {prefix}{i} cancelled", None),
    ]
    return [kinds[i % 3](i) for i in range(n)]


def test_first_terminal_write_wins_under_concurrency(pg_url: str) -> None:
    """3 processes x 4 threads + 12 threads settle one attempt with 24 different outcomes."""
    run_id = new_run()
    fence = must_claim(run_id)
    procs_n, per_child, local_n = 3, 4, 12
    barrier = SPAWN.Barrier(procs_n * per_child + local_n)
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=_settle_child,
                           args=((fence.run_id, fence.generation, fence.lease_token),
                                 _outcomes(f"p{k}-", per_child), barrier, out))
             for k in range(procs_n)]
    for p in procs:
        p.start()

    def one(o: tuple[Any, ...]) -> tuple[Any, ...]:
        barrier.wait(timeout=60)
        return _settled_tuple(fence, Outcome(*o))

    try:
        with ThreadPoolExecutor(local_n) as pool:
            local = list(pool.map(one, _outcomes("local-", local_n)))
        results = local + _collect(procs, out)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
    assert len(results) == procs_n * per_child + local_n
    winners = [r for r in results if r[0]]
    assert len(winners) == 1, winners
    winning = winners[0][1:]
    assert all(r[1:] == winning for r in results), "a loser was told a different outcome"
    assert outcome_of(run_id) == Outcome(*winning)
    kinds_now = event_kinds(run_id)
    assert sum(k in TERMINAL_EVENTS for k in kinds_now) == 1
    # Later writers, fenced or not, change nothing and hear the same answer.
    before = snapshot(run_id)
    late = Outcome(RunStatus.FAILED, "RUN_TIMEOUT", "late")
    assert _settled_tuple(fence, late) == (False, *winning)
    assert settle_unattended(run_id, Outcome("cancelled", "CANCELLED", "late")).outcome == \
        Outcome(*winning)
    assert snapshot(run_id) == before


def test_first_pushed_terminal_wins_under_concurrency(pg_url: str) -> None:
    """16 threads, each on its own connection, push 16 different terminals for one launch
    (the gateway's path): one wins, every loser is told that outcome, one terminal event."""
    fence, _ = launched()
    n = 16
    barrier = threading.Barrier(n)

    def one(outcome: Outcome) -> tuple[bool, Outcome]:
        barrier.wait(timeout=60)
        settled = settle_launch(fence, outcome)
        return settled.won, settled.outcome

    pushed = [Outcome(RunStatus.SUCCEEDED, output={"writer": i}) if i % 2
              else Outcome(RunStatus.FAILED, "PLAY_ERROR", f"writer {i} failed") for i in range(n)]
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, pushed))
    winners = [r for r in results if r[0]]
    assert len(winners) == 1, winners
    assert all(r[1] == winners[0][1] for r in results), "a loser was told a different outcome"
    assert outcome_of(fence.run_id) == winners[0][1]
    assert sum(k in TERMINAL_EVENTS for k in event_kinds(fence.run_id)) == 1


def test_one_launch_record_wins_among_racing_reports(pg_url: str) -> None:
    """12 threads report 12 different sandboxes for one attempt and its one reservation:
    one is live with the lease, the rest are kept for cleanup, one sandbox.live event."""
    org = f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}"
    fence = must_claim(new_run(org))
    lease_id = reserve(fence, org)
    n = 12
    barrier = threading.Barrier(n)
    refs = [SandboxRef("fake", f"fsb-{uuid.uuid4().hex[:12]}", {}, time.time())
            for _ in range(n)]

    def one(ref: SandboxRef) -> bool:
        barrier.wait(timeout=60)
        try:
            return record_launch(fence, get_settings(), ref, lease_id) is not None
        except FenceLostError:
            return False

    with ThreadPoolExecutor(n) as pool:
        won = list(pool.map(one, refs))
    assert won.count(True) == 1
    winner = refs[won.index(True)].sandbox_id
    after = snapshot(fence.run_id)
    assert sorted(state for _, state in after["resources"]) == ["cleanup"] * (n - 1) + ["live"]
    assert dict(after["resources"])[winner] == "live"
    assert after["leases"] == [(lease_id, "live", winner)]
    assert event_kinds(fence.run_id).count("sandbox.live") == 1
