"""Fencing under real concurrency on PostgreSQL (SPEC 3 step 3, 4.2).

Threads and processes race the same SQL rows: one claim wins, a stale fence writes
nothing, the first terminal write wins and never changes. A hypothesis test drives
interleavings of claims, lease expiry, reaper adoption, settlements and renewals.

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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models import Attempt, CapacityLease, Outbox, Run, RunEvent, RuntimeResource, db_now
from tasks.acquisition import capacity
from tasks.acquisition.claim import Claimed, Skipped, claim
from tasks.acquisition.sandbox import record_live
from tasks.admission.submit import admit
from tasks.constants import ATTEMPT_ACTIVE, ATTEMPT_FENCED_OUT, FAILED, SUCCEEDED, TERMINAL_STATUSES
from tasks.db import session_scope
from tasks.errors import FenceLostError
from tasks.fence import Fence, hold, renew
from tasks.maintenance.reaper import _adopt
from tasks.sandbox import SandboxRef
from tasks.settings import get_settings
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle, settle_unattended

ROOT = Path(__file__).resolve().parent.parent
NOOP = ROOT / "examples" / "plays" / "noop.py"
TERMINAL_EVENTS = ("run.succeeded", "run.failed", "run.cancelled")
SPAWN = mp.get_context("spawn")


# --- helpers ----------------------------------------------------------------------------

ORG_PREFIX = "fen-"


def new_run(org_id: str | None = None) -> str:
    """Admit a run the way submit_run does, but keep it off the broker (the test drives it)."""
    admitted = admit(NOOP, {}, org_id or f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}", None)
    with session_scope() as session:
        session.execute(sa.update(Outbox).where(Outbox.id == admitted.outbox_id)
                        .values(sent_at=db_now()))
    return admitted.run_id


def claim_now(run_id: str, worker: str = "w", lease_seconds: float = 30.0) -> Claimed | Skipped:
    with session_scope() as session:
        return claim(session, run_id, worker_id=worker, lease_seconds=lease_seconds)


def must_claim(run_id: str, worker: str = "w", lease_seconds: float = 30.0) -> Fence:
    result = claim_now(run_id, worker, lease_seconds)
    assert isinstance(result, Claimed), result
    return result.fence


def snapshot(run_id: str) -> dict[str, Any]:
    """Everything a write on behalf of an attempt could change, as plain values."""
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        attempts = session.execute(
            sa.select(Attempt.generation, Attempt.lease_token, Attempt.state,
                      Attempt.lease_expires_at, Attempt.end_reason, Attempt.sandbox_id,
                      Attempt.worker_id)
            .where(Attempt.run_id == run_id).order_by(Attempt.generation)).all()
        events = session.execute(
            sa.select(RunEvent.id, RunEvent.kind, RunEvent.generation)
            .where(RunEvent.run_id == run_id).order_by(RunEvent.id)).all()
        leases = session.execute(
            sa.select(CapacityLease.id, CapacityLease.state, CapacityLease.sandbox_id)
            .where(CapacityLease.run_id == run_id).order_by(CapacityLease.id)).all()
        resources = session.execute(
            sa.select(RuntimeResource.sandbox_id, RuntimeResource.state)
            .where(RuntimeResource.run_id == run_id).order_by(RuntimeResource.sandbox_id)).all()
        return {
            "run": (run.status, run.code, run.error, run.output, run.current_generation,
                    run.finished_at, run.updated_at),
            "attempts": [tuple(a) for a in attempts],
            "events": [tuple(e) for e in events],
            "leases": [tuple(x) for x in leases],
            "resources": [tuple(r) for r in resources],
        }


def outcome_of(run_id: str) -> Outcome:
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        return Outcome(run.status, run.code, run.error, run.output)


def event_kinds(run_id: str) -> list[str]:
    with session_scope() as session:
        return list(session.scalars(sa.select(RunEvent.kind).where(RunEvent.run_id == run_id)
                                    .order_by(RunEvent.id)))


def is_current(fence: Fence) -> bool:
    """The fence's truth, read independently of hold(): current, active, unexpired, open run."""
    with session_scope() as session:
        return bool(session.scalar(
            sa.select(sa.func.count()).select_from(Attempt).join(Run, Run.id == Attempt.run_id)
            .where(Attempt.run_id == fence.run_id, Attempt.generation == fence.generation,
                   Attempt.lease_token == fence.lease_token, Attempt.state == ATTEMPT_ACTIVE,
                   Attempt.lease_expires_at > db_now(),
                   Run.current_generation == fence.generation,
                   Run.status.not_in(list(TERMINAL_STATUSES)))))


def wait_lease_expired(fence: Fence, timeout: float = 10.0) -> None:
    """Poll the database clock (never the local one) until the fence's lease has passed."""
    deadline = time.monotonic() + timeout
    while True:
        with session_scope() as session:
            passed = session.scalar(sa.select(Attempt.lease_expires_at < db_now()).where(
                Attempt.run_id == fence.run_id, Attempt.generation == fence.generation))
        if passed:
            return
        assert time.monotonic() < deadline, "the lease never expired by the database clock"
        time.sleep(0.02)


def supersede(run_id: str) -> None:
    """Test harness: abandon the current attempt so the next claim opens a new generation."""
    with session_scope() as session:
        session.execute(sa.update(Attempt).where(
            Attempt.run_id == run_id, Attempt.state == ATTEMPT_ACTIVE,
        ).values(state=ATTEMPT_FENCED_OUT, ended_at=db_now()))


def close_open_runs(org_prefix: str) -> None:
    """Runs a module drove by hand end cancelled, so no later reaper or sweep adopts them."""
    with session_scope() as session:
        open_ids = sa.select(Run.id).where(Run.status.not_in(list(TERMINAL_STATUSES)),
                                           Run.org_id.startswith(org_prefix))
        session.execute(sa.update(Attempt).where(
            Attempt.run_id.in_(open_ids), Attempt.state.in_([ATTEMPT_ACTIVE, "deferred"]),
        ).values(state="ended", end_reason="test_cleanup", ended_at=db_now()))
        session.execute(sa.update(CapacityLease).where(
            CapacityLease.run_id.in_(open_ids), CapacityLease.state.in_(["reserved", "live"]),
        ).values(state="released", released_at=db_now()))
        session.execute(sa.update(Run).where(Run.id.in_(open_ids)).values(
            status="cancelled", code="CANCELLED", error="closed by the test harness",
            finished_at=db_now(), deferred_until=None))


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


def test_claim_skips_terminal_and_cancelled_runs(pg_url: str) -> None:
    done = new_run()
    fence = must_claim(done)
    assert settle(fence, Outcome(SUCCEEDED, output=1), reason="ended").won
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
        settle(stale, Outcome(SUCCEEDED, output={"stale": True}), reason="ended")
    with pytest.raises(FenceLostError), session_scope() as session:
        hold(session, stale)
        renew(session, stale, 3600)
    with pytest.raises(FenceLostError), session_scope() as session:
        hold(session, stale)
        capacity.reserve(session, stale, "org-stale", get_settings())
    assert snapshot(run_id) == before, "a stale fence changed something"
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

    if current is not None:
        # The real holder still writes: the fence is selective, not broken.
        assert settle(current, Outcome(FAILED, "PLAY_ERROR", "x"), reason="ended").won
        won = outcome_of(run_id)
        assert won.status == FAILED
        # Now the stale writer is told what won, and still writes nothing.
        late = settle(stale, Outcome(SUCCEEDED, output={"stale": True}), reason="ended")
        assert not late.won and late.outcome == won
        assert outcome_of(run_id) == won


# --- first write wins -----------------------------------------------------------------------

def _outcomes(prefix: str, n: int) -> list[tuple[Any, ...]]:
    kinds = [
        lambda i: (SUCCEEDED, None, None, {"writer": f"{prefix}{i}"}),
        lambda i: (FAILED, "PLAY_ERROR", f"writer {prefix}{i} failed", None),
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
    assert _settled_tuple(fence, Outcome(FAILED, "RUN_TIMEOUT", "late")) == (False, *winning)
    assert settle_unattended(run_id, Outcome("cancelled", "CANCELLED", "late")).outcome == \
        Outcome(*winning)
    assert snapshot(run_id) == before


# --- interleavings (hypothesis) -------------------------------------------------------------

OUTCOMES = [
    Outcome(SUCCEEDED, output={"n": 1}),
    Outcome(FAILED, "PLAY_ERROR", "boom"),
    Outcome("cancelled", "CANCELLED", "the run was cancelled"),
]
OPS = st.one_of(
    st.tuples(st.just("claim"), st.sampled_from(["A", "B"])),
    st.tuples(st.just("expire")),
    st.tuples(st.just("adopt")),
    st.tuples(st.just("settle"), st.sampled_from(["A", "B", "R"]), st.integers(0, 2)),
    st.tuples(st.just("renew"), st.sampled_from(["A", "B", "R"])),
    st.tuples(st.just("supersede")),
)


def _expire(run_id: str) -> None:
    """Time passes for the active attempt: its lease is now behind the database clock."""
    with session_scope() as session:
        session.execute(sa.update(Attempt).where(
            Attempt.run_id == run_id, Attempt.state == ATTEMPT_ACTIVE,
        ).values(lease_expires_at=db_now(-1)))


def _active_count(snap: dict[str, Any]) -> int:
    return sum(1 for a in snap["attempts"] if a[2] == ATTEMPT_ACTIVE)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=1, max_size=14))
def test_interleavings_keep_the_fence_invariants(pg_url: str, ops: list[tuple[Any, ...]]) -> None:
    run_id = new_run()
    fences: dict[str, Fence] = {}
    terminal: Outcome | None = None
    for op in ops:
        before = snapshot(run_id)
        name = op[0]
        if name == "claim":
            result = claim_now(run_id, op[1])
            if isinstance(result, Claimed):
                assert _active_count(before) == 0 and before["run"][0] not in TERMINAL_STATUSES
                assert result.fence.generation == before["run"][4] + 1
                fences[op[1]] = result.fence
            else:
                assert snapshot(run_id) == before, f"a skipped claim ({result}) wrote"
        elif name == "expire":
            _expire(run_id)
        elif name == "adopt":
            adopted = _adopt(run_id, get_settings())
            if adopted is not None:
                fences["R"] = adopted.fence
            else:
                assert snapshot(run_id) == before
        elif name == "supersede":
            supersede(run_id)
        elif op[1] in fences:
            fence = fences[op[1]]
            current = is_current(fence)
            try:
                if name == "settle":
                    settled = settle(fence, OUTCOMES[op[2]], reason="test")
                else:
                    with session_scope() as session:
                        hold(session, fence)
                        renew(session, fence, 30)
            except FenceLostError:
                assert not current, f"{op} by the current holder was refused"
                assert snapshot(run_id) == before, f"a refused {op} wrote"
            else:
                if name == "renew":
                    assert current, f"a renew by a stale fence committed: {op}"
                elif settled.won:
                    assert current, f"a settle by a stale fence won: {op}"
                    assert terminal is None
                    terminal = OUTCOMES[op[2]]
                else:
                    assert terminal is not None and settled.outcome == terminal
                    assert snapshot(run_id) == before
        # Invariants after every step.
        after = snapshot(run_id)
        assert _active_count(after) <= 1, after["attempts"]
        kinds_now = [e[1] for e in after["events"]]
        if terminal is not None:
            assert outcome_of(run_id) == terminal
            assert sum(k in TERMINAL_EVENTS for k in kinds_now) == 1
        else:
            assert after["run"][0] not in TERMINAL_STATUSES
            assert not any(k in TERMINAL_EVENTS for k in kinds_now)
        assert kinds_now.count("attempt.started") == after["run"][4]
