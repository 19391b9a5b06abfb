"""PLAYRUN_PROVIDER_MAX_LIVE: a provider's live sandboxes, fleet-wide, are leases in the
provider's pool taken with the org's, so concurrent workers never ask it for one more."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tasks
from models import CapacityLease
from tasks.acquisition import capacity
from tasks.acquisition.start import Opened, Step, acquire_sandbox, open_attempt
from tasks.execution.launch import record_launch
from tasks.release.capacity import release_lease
from tasks.sandbox import SandboxRef
from tasks.settings import Settings
from tasks.store.db import session_scope
from tests.support.runs import closes_open_runs, new_run, org_namer

ORG_PREFIX = "pool-"
org = org_namer(ORG_PREFIX)
_no_open_runs_left = closes_open_runs(ORG_PREFIX)


def pool_settings(max_live: int) -> Settings:
    return Settings(provider_max_live=max_live, org_capacity=50,
                    sandbox_provider=f"p{uuid.uuid4().hex[:10]}")


def held(org_id: str) -> list[tuple[str, int, str]]:
    with session_scope() as session:
        return [tuple(r) for r in session.execute(  # type: ignore[misc]
            sa.select(CapacityLease.run_id, CapacityLease.generation, CapacityLease.state)
            .where(CapacityLease.org_id == org_id, CapacityLease.state.in_(capacity.HELD)))]


def _open(run_id: str, config: Settings, start_at: float) -> Opened:
    time.sleep(max(0.0, start_at - time.time()))  # all clients at once
    opened = open_attempt(run_id, config)
    assert isinstance(opened, Opened), opened
    return opened


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(max_live=st.integers(1, 4), clients=st.integers(2, 9))
def test_concurrent_starts_never_pass_the_providers_live_limit(
        pg_url: str, max_live: int, clients: int) -> None:
    config = pool_settings(max_live)
    pool = capacity.pool_for(config.sandbox_provider)
    tenant = org()
    runs = [new_run(tenant) for _ in range(clients)]
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append(len(held(pool)))

    sampler = threading.Thread(target=sample)
    sampler.start()
    start_at = time.time() + 0.2
    try:
        with ThreadPoolExecutor(clients) as threads:
            opened = list(threads.map(lambda r: _open(r, config, start_at), runs))
    finally:
        stop.set()
        sampler.join()
    admitted = [o for o in opened if o.lease_id is not None]
    assert len(admitted) == min(max_live, clients)
    assert all(o.provider_full for o in opened if o.lease_id is None)
    assert max(seen, default=0) <= max_live and len(held(pool)) == len(admitted)
    # A run turned away by the provider's pool holds no slot of its org either.
    assert sorted(r for r, _g, _s in held(tenant)) == sorted(o.claimed.fence.run_id
                                                            for o in admitted)
    for o in admitted:
        release_lease(o.claimed.fence.run_id, o.claimed.fence.generation)
    assert held(pool) == [] and held(tenant) == []


def test_the_pool_lease_goes_live_with_the_sandbox_and_back_with_the_release(
        pg_url: str) -> None:
    config = pool_settings(1)
    pool = capacity.pool_for(config.sandbox_provider)
    first = open_attempt(new_run(org()), config)
    assert isinstance(first, Opened) and first.lease_id is not None
    fence = first.claimed.fence
    ref = SandboxRef(config.sandbox_provider, f"sb-{uuid.uuid4().hex[:8]}", {}, time.time())
    assert record_launch(fence, config, ref, first.lease_id) is not None
    assert held(pool) == [(fence.run_id, fence.generation, capacity.LIVE)]

    second = open_attempt(new_run(org()), config)
    assert isinstance(second, Opened) and second.provider_full
    acquired = acquire_sandbox(second, config)
    assert acquired.step is Step.DEFERRED
    deferred = [e.data for e in tasks.run_events(second.claimed.fence.run_id)
                if e.kind == "run.deferred"]
    assert [d["cause"] for d in deferred] == ["provider_capacity"]
    assert "PLAYRUN_PROVIDER_MAX_LIVE" in deferred[0]["detail"]

    release_lease(fence.run_id, fence.generation)
    assert held(pool) == []
