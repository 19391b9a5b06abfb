"""The gateway's limits (tasks/gateway/fleet/limits.py) on real Redis and on a Redis that
is not there: shared answers, releases sent together, a dead or silent Redis answered from
memory with one warning, and Redis tried again after RETRY_S."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aredis

from tasks.errors import GatewayAbuseError, GatewayRateLimitedError
from tasks.gateway.budgets import Budgets
from tasks.gateway.fleet import maths, store
from tasks.gateway.fleet.limits import RETRY_S, Hold, Limits
from tasks.gateway.fleet.pipe import Op, Pipe
from tasks.gateway.fleet.store import FleetStore, Key
from tasks.gateway.refusals import Refusals
from tasks.host.processes import free_port
from tests.support.session import TEST_REDIS_URL

LOGGER = "playrun.gateway"
P = maths.Params.of(requests_per_s=10, request_burst=5, bytes_per_s=1000, byte_burst=2000,
                    max_in_flight=2, abuse_refusals=3, abuse_window_s=60)
DOWN, BACK = "Redis did not answer", "Redis answers again"


def local() -> Budgets:
    return Budgets(requests_per_s=10, request_burst=5, bytes_per_s=1000, byte_burst=2000,
                   max_in_flight=2)


def attempt() -> Key:
    return (uuid.uuid4().hex, 1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limits_on(url: list[str], clock: Clock | None = None) -> Limits:
    """Limits over Redis at url[0] (read each time a loop makes its client)."""
    fleet = FleetStore(lambda: aredis.Redis.from_url(url[0], socket_timeout=store.TIMEOUT_S,
                                                     socket_connect_timeout=store.TIMEOUT_S),
                       P, prefix=f"playrun:gw-test:{uuid.uuid4().hex[:8]}:")
    return Limits(local(), fleet, monotonic=clock or time.monotonic)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def test_admit_and_release_are_shared_and_go_together(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = limits_on([TEST_REDIS_URL])
    assert limits.store is not None
    batches: list[list[str]] = []
    send = Pipe._pipeline

    async def counted(client: aredis.Redis, batch: list[Op]) -> list[Any]:
        batches.append(["release" if op.script is None else op.script.name for op in batch])
        return await send(client, batch)

    monkeypatch.setattr(Pipe, "_pipeline", staticmethod(counted))
    a = attempt()

    async def scenario() -> None:
        first, second = await asyncio.gather(limits.admit(a, 10), limits.admit(a, 10))
        assert first.rid and second.rid and first.rid != second.rid
        assert batches == [["admit", "admit"]]  # asked in the same turn: one round trip
        with pytest.raises(GatewayRateLimitedError, match="in flight") as caught:
            await limits.admit(a, 10)
        assert caught.value.retry_after_s == pytest.approx(0.1)
        limits.release(first)
        limits.release(second)
        third = await limits.admit(a, 10)
        # The releases went with the next admission, before it: both slots were free.
        assert batches[-1] == ["release", "release", "admit"]
        limits.release(third)
        await limits.drain()
        assert await limits.store.client.zcard(limits.store.keys(a)[2]) == 0  # type: ignore[union-attr]
        for _ in range(2):
            limits.release(await limits.admit(a, 10))
        with pytest.raises(GatewayRateLimitedError, match="rate") as caught:
            await limits.admit(a, 10)  # the burst of 5 is spent, the memory's untouched
        assert 0 < caught.value.retry_after_s <= 0.1
        assert limits.local._buckets == {}

    asyncio.run(scenario())
    assert limits.degraded_calls == 0


def test_the_shared_count_fails_the_attempt_once_and_admit_refuses_it() -> None:
    limits = limits_on([TEST_REDIS_URL])
    refusals = Refusals(limit=3, window_s=60, shared=limits)
    other = Refusals(limit=3, window_s=60, shared=limits)  # another gateway process
    a = attempt()

    async def scenario() -> None:
        verdicts = [await (refusals, other)[i % 2].refuse(a, "GATEWAY_BAD_REQUEST", 60)
                    for i in range(5)]
        assert [v.tripped for v in verdicts] == [False] * 3 + [True, False]
        assert verdicts[3].totals == {"GATEWAY_BAD_REQUEST": 4}
        assert verdicts[4].failed and verdicts[4].flush is None  # told: failed already
        with pytest.raises(GatewayAbuseError):
            refusals.check(a)  # this process knows; the other learns from Redis:
        with pytest.raises(GatewayAbuseError):
            await limits.admit(a, 1)

    asyncio.run(scenario())


def test_a_dead_redis_is_answered_from_memory_said_once_and_tried_again(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    url, clock = [f"redis://127.0.0.1:{free_port()}/0"], Clock()
    limits = limits_on(url, clock)
    a = attempt()

    async def down() -> None:
        holds = [await limits.admit(a, 10) for _ in range(2)]
        assert holds == [Hold(a), Hold(a)]  # in memory: the in-memory budgets apply
        with pytest.raises(GatewayRateLimitedError, match="in flight"):
            await limits.admit(a, 10)
        for hold in holds:
            limits.release(hold)
        assert await limits.count(a, "GATEWAY_BAD_REQUEST", 60) is None  # counted in memory

    asyncio.run(down())
    assert caplog.text.count(DOWN) == 1 and limits.degraded_calls == 4
    url[0] = TEST_REDIS_URL

    async def back() -> None:
        assert (await limits.admit(a, 10)).rid is None  # within RETRY_S: not tried
        clock.now += RETRY_S
        hold = await limits.admit(a, 10)
        assert hold.rid is not None
        limits.release(hold)
        await limits.drain()

    asyncio.run(back())
    assert caplog.text.count(DOWN) == 1 and caplog.text.count(BACK) == 1


def test_a_silent_redis_costs_one_timeout_then_nothing(silent_port: int,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    limits = limits_on([f"redis://127.0.0.1:{silent_port}/0"])
    a = attempt()

    async def scenario() -> tuple[float, float]:
        t0 = time.monotonic()
        hold = await limits.admit(a, 10)
        first = time.monotonic() - t0
        assert hold.rid is None
        limits.release(hold)
        t0 = time.monotonic()
        for _ in range(50):
            with contextlib.suppress(GatewayRateLimitedError):  # the memory's burst is 5
                limits.release(await limits.admit(a, 1))
        return first, time.monotonic() - t0

    first, then = asyncio.run(scenario())
    assert first < store.TIMEOUT_S * 3  # one timeout, never a retry of it
    assert then < store.TIMEOUT_S  # the rest went straight to memory
    assert caplog.text.count(DOWN) == 1
