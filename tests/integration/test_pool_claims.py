"""Warm pool claims under real concurrency on PostgreSQL: 16 processes race for a pool of
5, forty times; a hypothesis machine drives claims, deliveries, withdrawals, expiry and
pool removal in any order. Never one sandbox for two attempts, never a retired or expired
member handed out, never a delivered claim taken back.

Processes are spawned (never forked while holding pooled connections); this module must not
import tests.conftest at import time, since spawned children import it to find targets.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from models import PoolMember, RunEvent, RuntimeResource, db_now
from tasks.acquisition.pools import claim as pool_claim
from tasks.acquisition.pools import config, hygiene
from tasks.acquisition.start import Opened, open_attempt
from tasks.constants import EventKind, PoolMemberState
from tasks.execution.launch import launch_warm
from tasks.gateway.actions.standby import look
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tests.support.runs import close_open_runs, new_run

SPAWN = mp.get_context("spawn")
ORG_PREFIX = "pool-"
POOL = "default"
CLAIMERS = 16


def make_pool(ttl: str = "10m") -> config.Pool:
    pool = config.set_pool(config.build(POOL, 0, 50, ttl, "local"))
    pool_claim.cache.clear()
    return pool


def add_ready(n: int, *, expires_in_s: float = 600.0) -> list[str]:
    """Ready members as a refill leaves them (their sandboxes are not needed to claim)."""
    host = pool_claim.host_of("local")
    ids = [f"warm-{uuid.uuid4().hex[:12]}" for _ in range(n)]
    with session_scope() as session:
        for sandbox_id in ids:
            session.add(PoolMember(pool=POOL, provider="local", host=host, sandbox_id=sandbox_id,
                                   state=PoolMemberState.READY, ready_at=db_now(),
                                   seen_at=db_now(), expires_at=db_now(expires_in_s)))
    return ids


def _claimer(run_id: str, start_at: float) -> tuple[str, str | None]:
    """One worker process's start: open the attempt, then (at a common instant) claim."""
    settings = get_settings()
    opened = open_attempt(run_id, settings)
    assert isinstance(opened, Opened) and opened.lease_id is not None, opened
    pool = config.pool_named(POOL)
    assert pool is not None
    while time.time() < start_at:
        time.sleep(0.0005)
    got = launch_warm(opened.claimed.fence, pool, opened.lease_id, settings)
    return run_id, None if got is None else got[1].sandbox_id


def _warm() -> int:
    with session_scope(readonly=True) as session:
        return int(session.scalar(sa.select(sa.literal(1))) or 0)


@pytest.fixture(scope="module")
def claimers(pg_url: str) -> Iterator[ProcessPoolExecutor]:
    pool = ProcessPoolExecutor(max_workers=CLAIMERS, mp_context=SPAWN)
    try:
        assert [f.result(timeout=120) for f in
                [pool.submit(_warm) for _ in range(CLAIMERS)]] == [1] * CLAIMERS
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def clean(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)
    with session_scope() as session:
        session.execute(sa.delete(PoolMember))
    config.remove_pool(POOL)


def sandboxes_of(run_ids: list[str]) -> list[str]:
    with session_scope(readonly=True) as session:
        return list(session.scalars(sa.select(RuntimeResource.sandbox_id).where(
            RuntimeResource.run_id.in_(run_ids))).all())


def test_sixteen_processes_claim_a_pool_of_five_forty_times(
        claimers: ProcessPoolExecutor, clean: None) -> None:
    make_pool()
    for _ in range(40):
        warm = add_ready(5)
        runs = [new_run(f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}") for _ in range(CLAIMERS)]
        start_at = time.time() + 0.3
        got = dict(f.result(timeout=60) for f in
                   [claimers.submit(_claimer, run_id, start_at) for run_id in runs])
        taken = [s for s in got.values() if s is not None]
        # Every ready sandbox went to exactly one attempt; the rest found the pool empty.
        assert sorted(taken) == sorted(warm)
        assert sorted(sandboxes_of(runs)) == sorted(warm)
        with session_scope(readonly=True) as session:
            members = session.execute(sa.select(PoolMember.sandbox_id, PoolMember.run_id)
                                      .where(PoolMember.sandbox_id.in_(warm))).all()
            claimed_events = session.execute(sa.select(RunEvent.run_id).where(
                RunEvent.run_id.in_(runs), RunEvent.kind == EventKind.POOL_CLAIMED)).all()
        assert {s: r for s, r in members} == {s: r for r, s in got.items() if s is not None}
        assert sorted(r for (r,) in claimed_events) == sorted(
            r for r, s in got.items() if s is not None)
        close_open_runs(ORG_PREFIX)


class Pools(RuleBasedStateMachine):
    """Operations on one pool in any order; each is one of the real transactions."""

    def __init__(self) -> None:
        super().__init__()
        make_pool()
        self.runs: list[str] = []
        self.delivered: set[str] = set()  # sandboxes whose standby took their run
        self.claims: dict[str, str] = {}  # sandbox -> run

    @rule(n=st.integers(1, 3), expired=st.booleans())
    def refill(self, n: int, expired: bool) -> None:
        add_ready(n, expires_in_s=-1.0 if expired else 600.0)

    @rule()
    def claim(self) -> None:
        run_id = new_run(f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}")
        self.runs.append(run_id)
        opened = open_attempt(run_id, get_settings())
        assert isinstance(opened, Opened) and opened.lease_id is not None
        pool = config.pool_named(POOL)
        if pool is None:
            return
        got = launch_warm(opened.claimed.fence, pool, opened.lease_id, get_settings())
        if got is not None:
            sandbox = got[1].sandbox_id
            assert sandbox not in self.claims, "a sandbox handed out twice"
            self.claims[sandbox] = run_id

    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        members = self._members()
        if members:
            member_id, sandbox_id, _state = data.draw(st.sampled_from(members))
            answer = look(member_id, get_settings())
            if answer is not None and answer.get("assigned"):
                self.delivered.add(sandbox_id)

    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        if self.claims:
            sandbox = data.draw(st.sampled_from(sorted(self.claims)))
            if pool_claim.withdraw("local", sandbox):
                assert sandbox not in self.delivered, "a delivered claim taken back"

    @rule()
    def tick(self) -> None:
        hygiene.tick(get_settings())

    @rule()
    def remove_and_recreate(self) -> None:
        config.remove_pool(POOL)
        make_pool()

    def _members(self) -> list[Any]:
        with session_scope(readonly=True) as session:
            return [tuple(r) for r in session.execute(sa.select(
                PoolMember.id, PoolMember.sandbox_id, PoolMember.state)).all()]

    @invariant()
    def one_attempt_per_sandbox(self) -> None:
        with session_scope(readonly=True) as session:
            dupes = session.execute(sa.select(RuntimeResource.sandbox_id).where(
                RuntimeResource.sandbox_id.like("warm-%")).group_by(
                RuntimeResource.sandbox_id).having(sa.func.count() > 1)).all()
            expired = session.scalar(sa.select(sa.func.count()).select_from(PoolMember).where(
                PoolMember.state == PoolMemberState.CLAIMED,
                PoolMember.claimed_at > PoolMember.expires_at))
        assert not dupes and not expired

    def teardown(self) -> None:
        close_open_runs(ORG_PREFIX)
        with session_scope() as session:
            session.execute(sa.delete(PoolMember))
        config.remove_pool(POOL)


TestPools = Pools.TestCase
TestPools.settings = settings(max_examples=20, stateful_step_count=12, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow,
                                                     HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def _database(pg_url: str) -> None:
    """The machine's test case runs on the session database too."""
