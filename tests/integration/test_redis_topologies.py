"""playrun's Redis clients on Redis Sentinel and Redis Cluster (private servers on loopback
from the redis-server binary): clients follow a failover, the start-rate bucket keeps its
bound under contending processes on a cluster and through a failover (docs/operations.md)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from tasks.acquisition.fairshare.store import Keys
from tasks.acquisition.startrate import RateRule, StartRateLimiter
from tasks.constants import KEY_FAIR, KEY_GATEWAY
from tasks.gateway.fleet.store import FleetStore, client_for
from tasks.store import redisconn
from tasks.testing.topologies import Cluster, SentinelGroup
from tests.support.helpers import eventually
from tests.support.paths import ROOT
from tests.support.redis_topologies import most_in_window, started

RATE = 600.0  # per minute: one start per 100 ms
RULE = RateRule("provider", RATE, RATE, RATE, 0.0, 0.5)


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    yield from started(SentinelGroup(tmp_path))


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from started(Cluster(tmp_path))


LEAD_S = 3.0  # the contenders' imports, under load, before they start together


def contenders(url: str, bucket: str, n: int, seconds: float,
               rules: int) -> tuple[float, list[subprocess.Popen[str]]]:
    """n contender processes; when they start (together) and the processes."""
    start_at = time.time() + LEAD_S
    return start_at, [subprocess.Popen(
        [sys.executable, "-m", "tests.support.contender", url, bucket, str(RATE), str(start_at),
         str(seconds), str(rules)], cwd=str(ROOT), stdout=subprocess.PIPE, text=True)
        for _ in range(n)]


def results(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    out = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        out.append(json.loads(stdout))
    return out


def bound(window_s: float) -> int:
    """GCRA's bound: one start per interval, plus the one a window's edge can catch."""
    return int(window_s * RATE / 60) + 1


def test_clients_follow_the_primary_through_a_failover(sentinel_group: SentinelGroup) -> None:
    """After SENTINEL FAILOVER the old primary takes writes for ~10 s more, until the
    sentinels turn it into a replica: clients in use must move off it before that."""
    url = sentinel_group.url(5)
    client = redisconn.client(url, socket_timeout=2)
    client.set("before", "1")
    limiter = StartRateLimiter(client)
    bucket = f"b-{uuid.uuid4().hex[:8]}"
    assert limiter.acquire(bucket, [RULE]).granted
    old = sentinel_group.primary_port()
    new = sentinel_group.failover()
    assert new != old
    promoted = redis.Redis(port=new, db=5)

    def lands_on_new(key: str) -> bool:
        client.set(key, "1")
        return promoted.get(key) == b"1"

    # Within SENTINEL_FOLLOW_S (0.5 s), long before the old primary refuses writes.
    started = time.monotonic()
    eventually(lambda: lands_on_new(f"k-{uuid.uuid4().hex[:6]}"), timeout=5,
               what="the client's writes to reach the new primary")
    assert time.monotonic() - started < 3
    eventually(lambda: limiter.acquire(bucket, [RULE]).granted and promoted.exists(
        limiter.key(bucket, RULE.name)), timeout=5, what="the limiter on the new primary")
    assert limiter.degraded_calls == 0
    assert promoted.get("before") == b"1"  # a planned failover loses nothing
    # The gateway's asyncio client, as its budgets make it, reaches the new primary too.
    assert asyncio.run(_async_get(url, "before")) == b"1"
    assert asyncio.run(_async_port(url)) == new


async def _async_port(url: str) -> int:
    client = client_for(url)
    try:
        await client.ping()
        return int(client.connection_pool.master_address[1])  # type: ignore[attr-defined]
    finally:
        await client.aclose()


async def _async_get(url: str, key: str) -> object:
    client = client_for(url)
    try:
        return await client.get(key)
    finally:
        await client.aclose()


def test_start_rate_when_the_primary_is_killed(sentinel_group: SentinelGroup) -> None:
    """4 processes at 10 starts/s; the primary dies 2 s in. While the sentinels have not
    named another, each process paces itself in memory at the initial rate: the excess
    the docs state (operations.md, "Redis Sentinel")."""
    start_at, procs = contenders(sentinel_group.url(6), f"b-{uuid.uuid4().hex[:8]}", 4, 7.0, 1)
    time.sleep(start_at + 2.0 - time.time())  # the contenders run a fixed time: fault inside
    old = sentinel_group.primary_port()
    killed_at = time.time()
    sentinel_group.primary.kill(signal.SIGKILL)
    new = sentinel_group.wait_for_other_primary(old)
    healed_at = time.time()
    out = results(procs)
    starts = [t for r in out for t, _ in r["starts"]]
    degraded = [t for r in out for t, d in r["starts"] if d]
    before = [t for t in starts if t < killed_at]
    after = [t for t in starts if t > healed_at + 1.5]  # breaker and rediscovery done
    print(f"\nfailover to :{new} took {healed_at - killed_at:.1f} s; starts {len(starts)}, "
          f"degraded {len(degraded)} over {max(degraded) - min(degraded):.1f} s; "
          f"most in 1 s: before {most_in_window(before, 1)}, "
          f"overall {most_in_window(starts, 1)}, after {most_in_window(after, 1)} "
          f"(bound {bound(1)})")
    assert most_in_window(before, 1) <= bound(1)
    assert after and most_in_window(after, 1) <= bound(1)
    # Degraded: each process alone at the initial rate, so at most one bound per process.
    assert most_in_window(starts, 1) <= 4 * bound(1) + bound(1)
    # Only while Redis had no primary, and for at most one breaker interval (1 s) after.
    assert degraded and killed_at <= min(degraded) and max(degraded) <= healed_at + 1.5


def test_start_rate_on_a_cluster_under_8_processes(redis_cluster: Cluster) -> None:
    """8 processes on one bucket of two rules (two keys, one slot): no excess grant."""
    start_at, procs = contenders(redis_cluster.url(), f"b-{uuid.uuid4().hex[:8]}", 8, 4.0, 2)
    out = results(procs)
    assert all(r["degraded_calls"] == 0 for r in out)  # a cross-slot call would degrade
    starts = [t for r in out for t, _ in r["starts"]]
    print(f"\ncluster: {len(starts)} starts in {max(starts) - min(starts):.1f} s, "
          f"most in 1 s {most_in_window(starts, 1)} "
          f"(bound {bound(1)})")
    assert most_in_window(starts, 1) <= bound(1)
    assert min(starts) >= start_at
    # Over the whole run (past the 4 s by the 1 s horizon of reserved slots), +1 for a
    # start recorded a little after its slot.
    assert len(starts) <= bound(max(starts) - start_at) + 1


def test_every_script_keeps_its_keys_in_one_slot() -> None:
    """What Redis Cluster needs of an EVALSHA: the keys of one call hash to one slot."""
    limiter = StartRateLimiter.__new__(StartRateLimiter)
    limiter.prefix = "playrun:startrate:"
    rate = {key_slot(limiter.key("modal", name).encode()) for name in ("provider", "global")}
    fair = Keys.under(KEY_FAIR)
    fairs = {key_slot(k.encode()) for k in (fair.tags, fair.inflight, fair.owners, fair.counts,
                                            fair.lease, fair.again)}
    store = FleetStore.__new__(FleetStore)
    store.prefix = KEY_GATEWAY
    gateway = {key_slot(k.encode()) for k in store.keys(("run1", 2))}
    assert len(rate) == len(fairs) == len(gateway) == 1
