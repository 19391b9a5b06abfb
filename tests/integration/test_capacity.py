"""Capacity leases on PostgreSQL (docs/design.md): the limit holds under any interleaving of
clients, promotion is a compare-and-set, every terminal path gives back its lease and
its sandbox, stale reservations expire, `observe` mode records the overrun, and one
org's limit never touches another's.

Like test_fencing_concurrency, this module is imported by spawned children: it must not
import tests.conftest at import time (fixtures import it lazily).
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import tasks
from models import CapacityLease, RuntimeResource, db_now
from tasks.acquisition import capacity
from tasks.acquisition.claim import Claimed
from tasks.acquisition.deferral import defer
from tasks.acquisition.sandbox import labels_for, record_live
from tasks.broker.publish import StubPublisher
from tasks.constants import CAPACITY_EXCEEDED_MESSAGE, LABEL_RUN, MAX_SQL_INT, RunStatus
from tasks.errors import CapacityExceededError, FenceLostError
from tasks.maintenance.reaper import _adopt, expire_reservations
from tasks.release.attempt import release_attempt
from tasks.release.capacity import release_lease
from tasks.sandbox import SandboxSpec
from tasks.sandbox.runtime import provider as runtime_provider
from tasks.settings import get_settings
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle
from tasks.store.db import session_scope
from tasks.store.fence import Fence, hold
from tests.support.helpers import eventually, kinds
from tests.support.runs import (
    claim_now,
    close_open_runs,
    held,
    is_current,
    lease,
    must_claim,
    new_run,
    promote,
    reserve,
    supersede,
    wait_lease_expired,
)

SPAWN = mp.get_context("spawn")


ORG_PREFIX = "cap-"


def org() -> str:
    return f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}"


# --- live + reserved never exceeds the limit (threads, processes, hypothesis) ----------------

def _client(run_id: str, generation: int, token: str, org_id: str, ops: list[str],
            start_at: float) -> dict[str, int]:
    """One worker's view of capacity: reserve, promote, release in the order it is given."""
    fence = Fence(run_id, generation, token)
    stats = {"reserved": 0, "rejected": 0, "promoted": 0, "released": 0}
    lease_id: str | None = None
    live = False
    while time.time() < start_at:  # a common starting instant for threads and processes
        time.sleep(0.001)
    for op in ops:
        if op == "reserve" and lease_id is None:
            try:
                lease_id = reserve(fence, org_id)
                stats["reserved"] += 1
            except CapacityExceededError:
                stats["rejected"] += 1
        elif op == "promote" and lease_id is not None and not live:
            promote(fence, lease_id, "fake", f"sb-{run_id}")
            live = True
            stats["promoted"] += 1
        elif op == "release" and lease_id is not None:
            assert release_lease(run_id, generation) == [lease_id]
            lease_id, live = None, False
            stats["released"] += 1
    return stats


def _warm() -> int:
    """Import everything and open the engine in a pool process before the clock matters."""
    with session_scope() as session:
        return int(session.scalar(sa.select(sa.literal(1))) or 0)


@pytest.fixture(scope="module")
def proc_pool(pg_url: str) -> Iterator[ProcessPoolExecutor]:
    pool = ProcessPoolExecutor(max_workers=3, mp_context=SPAWN)
    try:
        assert [f.result(timeout=60) for f in [pool.submit(_warm) for _ in range(6)]] == [1] * 6
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _sampler(org_id: str, stop: threading.Event, seen: list[int]) -> None:
    """An operator's `capacity show`, as fast as it can: held leases of the org, sampled live."""
    from tasks.store.db import get_engine

    stmt = sa.select(sa.func.count()).select_from(CapacityLease).where(
        CapacityLease.org_id == org_id, CapacityLease.state.in_(capacity.HELD))
    with get_engine().connect() as conn:
        while not stop.is_set():
            seen.append(int(conn.execute(stmt).scalar_one()))
            conn.rollback()


OP = st.sampled_from(["reserve", "reserve", "promote", "release"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limit=st.integers(0, 4),
       scripts=st.lists(st.lists(OP, min_size=1, max_size=6), min_size=2, max_size=9),
       in_processes=st.integers(0, 3))
def test_live_plus_reserved_never_exceeds_the_limit(
    pg_url: str, proc_pool: ProcessPoolExecutor, limit: int, scripts: list[list[str]],
    in_processes: int,
) -> None:
    org_id = org()
    capacity.set_limit(org_id, limit)
    fences = [must_claim(new_run(org_id)) for _ in scripts]
    seen: list[int] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sampler, args=(org_id, stop, seen))
    sampler.start()
    start_at = time.time() + 0.25
    jobs = [(f.run_id, f.generation, f.lease_token, org_id, ops, start_at)
            for f, ops in zip(fences, scripts, strict=True)]
    try:
        remote = [proc_pool.submit(_client, *job) for job in jobs[:in_processes]]
        with ThreadPoolExecutor(len(jobs)) as threads:
            local = [threads.submit(_client, *job) for job in jobs[in_processes:]]
            stats = [f.result(timeout=60) for f in remote + local]
    finally:
        stop.set()
        sampler.join()
    final = held(org_id)
    assert seen, "the sampler never read the org"
    assert max(seen) <= limit and final <= limit, (max(seen), final, limit)
    reserved = sum(s["reserved"] for s in stats)
    wanted = any("reserve" in ops for ops in scripts)
    if limit == 0:
        assert reserved == 0
    elif wanted:
        assert reserved >= 1, "the first reservation of an empty org was refused"
    # Whatever is still held is exactly what the clients did not release, and goes back.
    assert final == sum(s["reserved"] - s["released"] for s in stats)
    for f in fences:
        release_lease(f.run_id, f.generation)
    assert held(org_id) == 0


def test_a_full_org_rejects_with_the_capacity_message(pg_url: str) -> None:
    org_id = org()
    capacity.set_limit(org_id, 2)
    fences = [must_claim(new_run(org_id)) for _ in range(3)]
    reserve(fences[0], org_id)
    reserve(fences[1], org_id)
    with pytest.raises(CapacityExceededError) as caught:
        reserve(fences[2], org_id)
    assert caught.value.code == "SANDBOX_CAPACITY_EXCEEDED"
    assert caught.value.message == CAPACITY_EXCEEDED_MESSAGE
    assert held(org_id) == 2
    # A release frees exactly one slot.
    release_lease(fences[0].run_id, fences[0].generation)
    reserve(fences[2], org_id)
    assert held(org_id) == 2


def test_two_orgs_do_not_share_a_limit(pg_url: str) -> None:
    a, b = org(), org()
    capacity.set_limit(a, 1)
    capacity.set_limit(b, 1)
    fa = [must_claim(new_run(a)) for _ in range(2)]
    fb = must_claim(new_run(b))
    reserve(fa[0], a)
    with pytest.raises(CapacityExceededError):
        reserve(fa[1], a)
    reserve(fb, b)  # org A being full does not touch org B
    assert (held(a), held(b)) == (1, 1)
    rows = {row[0]: row[1:] for row in capacity.show(get_settings().org_capacity)}
    assert rows[a] == (1, 1, 0) and rows[b] == (1, 1, 0)


# --- promotion is a compare-and-set --------------------------------------------------------

def test_promotion_is_a_compare_and_set(pg_url: str) -> None:
    org_id = org()
    run_id = new_run(org_id)
    first = must_claim(run_id)
    lease_id = reserve(first, org_id)
    promote(first, lease_id, "local", "lsb-aaaaaaaaaaaaaaaa")
    assert lease(lease_id) == ("live", "local", "lsb-aaaaaaaaaaaaaaaa")
    # The same sandbox re-reported by the same intact attempt: idempotent success.
    promote(first, lease_id, "local", "lsb-aaaaaaaaaaaaaaaa")
    assert lease(lease_id) == ("live", "local", "lsb-aaaaaaaaaaaaaaaa")
    # Another sandbox id, or another provider, for the same lease: a fence loss.
    with pytest.raises(FenceLostError):
        promote(first, lease_id, "local", "lsb-bbbbbbbbbbbbbbbb")
    with pytest.raises(FenceLostError):
        promote(first, lease_id, "fake", "lsb-aaaaaaaaaaaaaaaa")
    assert lease(lease_id) == ("live", "local", "lsb-aaaaaaaaaaaaaaaa")
    # A stale attempt: generation 1 is superseded by generation 2.
    supersede(run_id)
    second = must_claim(run_id)
    assert second.generation == 2
    with pytest.raises(FenceLostError):  # the old attempt cannot even hold its fence
        promote(first, lease_id, "local", "lsb-aaaaaaaaaaaaaaaa")
    with pytest.raises(FenceLostError):  # the new one cannot take the old attempt's lease
        promote(second, lease_id, "local", "lsb-aaaaaaaaaaaaaaaa")
    assert lease(lease_id) == ("live", "local", "lsb-aaaaaaaaaaaaaaaa")
    # A released lease cannot be promoted by anyone.
    fresh = reserve(second, org_id)
    release_lease(run_id, 2)
    with pytest.raises(FenceLostError):
        promote(second, fresh, "local", "lsb-cccccccccccccccc")
    assert lease(fresh) == ("released", None, None)
    assert kinds(run_id).count("capacity.released") == 1


def test_a_stale_attempt_can_neither_reserve_nor_promote(pg_url: str) -> None:
    """reserve and promote check the fence in their own statement: a superseded attempt
    takes no slot and moves no lease, and the current one is untouched."""
    org_id = org()
    run_id = new_run(org_id)
    first = must_claim(run_id)
    old_lease = reserve(first, org_id)
    supersede(run_id)
    second = must_claim(run_id)
    with pytest.raises(FenceLostError):
        reserve(first, org_id)
    with pytest.raises(FenceLostError):
        promote(first, old_lease, "local", "lsb-dddddddddddddddd")
    assert lease(old_lease) == ("reserved", None, None)
    with session_scope() as session:
        rows = session.execute(sa.select(CapacityLease.generation).where(
            CapacityLease.run_id == run_id)).scalars().all()
    assert rows == [1]  # nothing was taken for the stale attempt
    new_lease = reserve(second, org_id)
    promote(second, new_lease, "local", "lsb-eeeeeeeeeeeeeeee")
    assert lease(new_lease) == ("live", "local", "lsb-eeeeeeeeeeeeeeee")
    assert release_lease(run_id, 2) == [new_lease]


def test_the_largest_limit_reserves_and_a_larger_one_is_refused(pg_url: str) -> None:
    settings = get_settings().model_copy(update={"org_capacity": MAX_SQL_INT})
    org_id = org()
    fence = must_claim(new_run(org_id))
    lease_id = reserve(fence, org_id, settings)
    assert lease(lease_id) == ("reserved", None, None)
    assert release_lease(fence.run_id, fence.generation) == [lease_id]
    with pytest.raises(ValidationError):
        type(settings)(org_capacity=MAX_SQL_INT + 1)


def test_a_late_sandbox_is_recorded_and_deleted_and_the_new_holder_keeps_its_own(
    pg_url: str, published: StubPublisher,
) -> None:
    """Worker A stalls in provider create; the reaper adopts the attempt and defers it; B
    resumes the same generation and goes live. A's create then returns: its report is
    refused, its sandbox recorded for cleanup and deleted, and B's sandbox and lease stay."""
    settings = get_settings().model_copy(update={"deferral_base_ms": 1, "deferral_max_ms": 2})
    org_id = org()
    run_id = new_run(org_id)
    prov = runtime_provider("local")
    a = must_claim(run_id, "A", lease_seconds=0.5)
    lease_a = reserve(a, org_id, settings)
    claimed_a = Claimed(a, org_id, "", {}, False)
    late = prov.create(SandboxSpec(labels=labels_for(claimed_a, lease_a)))  # A, in flight
    wait_lease_expired(a)
    adopted = _adopt(run_id, settings)
    assert adopted is not None and adopted.launched is False  # nothing was launched
    assert defer(adopted.fence, "worker_lost", settings,
                 detail="A stopped") == "deferred"
    assert lease(lease_a)[0] == "released"
    b = eventually(lambda: (lambda r: r.fence if isinstance(r, Claimed) else None)(
        claim_now(run_id, "B")), timeout=10, what="the deferred start to be due")
    assert b.generation == a.generation and b.lease_token != a.lease_token
    lease_b = reserve(b, org_id, settings)
    mine = prov.create(SandboxSpec(labels=labels_for(Claimed(b, org_id, "", {}, False),
                                                     lease_b)))
    record_live(b, mine, lambda s, ref: capacity.promote(s, b, lease_b, ref.provider,
                                                         ref.sandbox_id))
    # A's create returns now; start() records, and on FenceLostError releases the attempt.
    with pytest.raises(FenceLostError):
        record_live(a, late, lambda s, ref: capacity.promote(s, a, lease_a, ref.provider,
                                                             ref.sandbox_id))
    release_attempt(run_id, a.generation, a.lease_token)

    listed = {r.sandbox_id for r in prov.list({LABEL_RUN: run_id})}
    assert late.sandbox_id not in listed, "the late sandbox was left running"
    assert mine.sandbox_id in listed, "the stale worker deleted the current holder's sandbox"
    with session_scope() as session:
        states = dict(session.execute(sa.select(RuntimeResource.sandbox_id, RuntimeResource.state)
                                      .where(RuntimeResource.run_id == run_id)).all())
    assert states == {late.sandbox_id: "deleted", mine.sandbox_id: "live"}
    assert lease(lease_b) == ("live", "local", mine.sandbox_id)
    assert is_current(b)
    deleted = [e.data for e in tasks.run_events(run_id) if e.kind == "sandbox.deleted"]
    assert deleted == [{"sandbox_id": late.sandbox_id}]
    # B finishes normally and gives everything back.
    assert settle(b, Outcome(RunStatus.SUCCEEDED, output={}), reason="ended").won
    release_attempt(run_id, b.generation, b.lease_token)
    assert prov.list({LABEL_RUN: run_id}) == []
    assert lease(lease_b)[0] == "released"


# --- stale reservations ----------------------------------------------------------------------

def test_a_reservation_that_never_went_live_expires(pg_url: str) -> None:
    settings = get_settings().model_copy(update={"capacity_reservation_ttl_s": 0.3})
    org_id = org()
    capacity.set_limit(org_id, 1)
    stale_run = new_run(org_id)
    stale = must_claim(stale_run)
    lease_id = reserve(stale, org_id, settings)
    waiting = must_claim(new_run(org_id))
    with pytest.raises(CapacityExceededError):
        reserve(waiting, org_id, settings)

    def past() -> bool:
        with session_scope() as session:
            return bool(session.scalar(sa.select(CapacityLease.expires_at < db_now())
                                       .where(CapacityLease.id == lease_id)))

    eventually(past, timeout=10, what="the reservation to pass its expiry by the db clock")
    assert expire_reservations() >= 1
    assert lease(lease_id)[0] == "released"
    released = [e.data for e in tasks.run_events(stale_run) if e.kind == "capacity.released"]
    assert released == [{"lease_id": lease_id, "reason": "reservation expired"}]
    assert expire_reservations() == 0  # once only: a second pass finds nothing to expire
    assert kinds(stale_run).count("capacity.released") == 1
    # The slot is free again, and the expired reservation can no longer go live.
    reserve(waiting, org_id, settings)
    with pytest.raises(FenceLostError):
        promote(stale, lease_id, "local", "lsb-dddddddddddddddd")


# --- tidy up -------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _no_open_runs_left(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)


def test_expiry_racing_a_promotion_neither_deadlocks_nor_fails(pg_url: str) -> None:
    """The reaper expiring a reservation while its worker promotes it: the worker holds the
    run row (every fenced write locks run, then its rows); the reaper must take the same
    order, or PostgreSQL aborts one side with a deadlock."""
    from tasks.store.db import get_engine

    settings = get_settings().model_copy(update={"capacity_reservation_ttl_s": 0.2})
    org_id = org()
    fence = must_claim(new_run(org_id))
    lease_id = reserve(fence, org_id, settings)
    with session_scope() as session:
        eventually(lambda: session.scalar(sa.select(CapacityLease.expires_at < db_now())
                                          .where(CapacityLease.id == lease_id)),
                   what="the reservation to expire by the db clock")
    outcome: dict[str, Any] = {}

    def reaper() -> None:
        try:
            outcome["expired"] = expire_reservations()
        except Exception as exc:  # reported below
            outcome["error"] = exc

    engine = get_engine()
    with sa.orm.Session(engine) as worker_session, worker_session.begin():
        hold(worker_session, fence)  # the worker's fenced transaction is open
        pid = worker_session.scalar(sa.text("SELECT pg_backend_pid()"))
        t = threading.Thread(target=reaper)
        t.start()
        eventually(lambda: _blocked_by(pid), timeout=10, what="the reaper to wait on the worker")
        try:
            capacity.promote(worker_session, fence, lease_id, "local", "lsb-eeeeeeeeeeeeeeee")
        except sa.exc.DBAPIError as exc:
            outcome["worker_error"] = exc
    t.join(timeout=30)
    assert "error" not in outcome and "worker_error" not in outcome, outcome
    # The worker got there first: the lease is live, and the reaper left it alone.
    assert lease(lease_id) == ("live", "local", "lsb-eeeeeeeeeeeeeeee")
    assert "capacity.released" not in kinds(fence.run_id)


def _blocked_by(pid: int) -> bool:
    with session_scope() as session:
        return bool(session.scalar(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"),
            {"pid": pid}))
