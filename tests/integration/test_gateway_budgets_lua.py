"""The fleet-wide gateway budgets in Redis against their Python maths: the scripts take an
optional test clock (empty in production, where Redis TIME is the clock), so hypothesis
replays the same admissions, releases, refusals and clock steps through Lua and through
`fleet.maths`, and every answer, stored field and key expiry must match."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio as aredis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from tasks.gateway.fleet import maths
from tasks.gateway.fleet.maths import BYTE, REQUEST, Params, State
from tasks.gateway.fleet.store import FleetStore
from tests.support.session import TEST_REDIS_URL

T = TypeVar("T")
T0 = 1_796_000_000_000_000
CODES = ["GATEWAY_BAD_REQUEST", "GATEWAY_RATE_LIMITED", "c:odd code"]


def run(make: Callable[[FleetStore], Awaitable[T]], params: Params) -> T:
    """One store on a loop of its own (an asyncio client serves one loop)."""
    store = FleetStore(lambda: aredis.Redis.from_url(TEST_REDIS_URL), params,
                       prefix=f"playrun:gw-test:{uuid.uuid4().hex[:8]}:")

    async def go() -> T:
        try:
            return await make(store)
        finally:
            client = store.client
            keys = [k async for k in client.scan_iter(match=store.prefix + "*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()

    return asyncio.run(go())


async def stored(store: FleetStore, key: tuple[str, int]) -> State:
    """What Redis holds of the attempt, in the reference's shape (ttl_ms left out)."""
    bucket, abuse, flight = store.keys(key)
    c = store.client
    b = {k.decode(): int(v) for k, v in (await c.hgetall(bucket)).items()}  # type: ignore[misc]
    a = {k.decode(): int(v) for k, v in (await c.hgetall(abuse)).items()}  # type: ignore[misc]
    f = {m.decode(): int(s) for m, s in await c.zrange(flight, 0, -1, withscores=True)}
    return State(b.get("r"), b.get("b"), b.get("t"), a.get("l"), a.get("u"), a.get("x"),
                 {k[2:]: v for k, v in a.items() if k.startswith("c:")}, f)


params_st = st.builds(
    Params,
    request_rate=st.integers(1, 2_000_000),
    request_burst=st.integers(REQUEST, 20 * REQUEST),
    byte_rate=st.integers(1, 50_000_000),
    byte_burst=st.integers(1, 100_000).map(lambda n: n * BYTE),
    byte_cap=st.just(0),  # set from byte_burst below
    max_in_flight=st.integers(1, 4),
    hold_us=st.integers(1, 3_000_000),
    limit=st.integers(1, 6),
    window_ms=st.integers(1, 1_000_000),
).map(lambda p: Params(**{**p.__dict__, "byte_cap": p.byte_burst // BYTE}))

# When the next call happens: a clock step (back a little too, as after a failover), or
# exactly on / one microsecond around what the last answer said to wait, or a hold's end.
when_st = st.one_of(
    st.tuples(st.just("step"), st.integers(-5_000, 3_000_000) | st.integers(0, 2_000)),
    st.tuples(st.sampled_from(["wait", "hold"]), st.integers(-1, 1)),
)
op_st = st.one_of(
    st.tuples(st.just("admit"), st.integers(0, 120_000), st.integers(0, 1)),
    st.tuples(st.just("release"), st.integers(0, 8), st.integers(0, 1)),
    st.tuples(st.just("refuse"), st.sampled_from(CODES), st.integers(-10**6, 10**9)),
    st.tuples(st.just("when"), when_st, st.just(0)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=params_st, ops=st.lists(op_st, min_size=5, max_size=50),
       start=st.integers(0, 10**9))
def test_lua_and_python_agree_on_every_sequence(params: Params, ops: list[tuple[Any, ...]],
                                                start: int) -> None:
    async def scenario(store: FleetStore) -> None:
        attempts = [(uuid.uuid4().hex, 1), (uuid.uuid4().hex, 2)]
        model = {a: State() for a in attempts}
        now, wait_until, admitted, n = T0 + start, T0 + start, [], 0
        for op, x, y in ops:
            key = attempts[y] if op != "refuse" else attempts[0]
            s = model[key]
            if op == "when":
                kind, v = x
                if kind == "step":
                    now += v
                elif kind == "wait":
                    now = wait_until + v
                elif s.flight:
                    now = min(s.flight.values()) + v
                continue
            s.ttl_ms.clear()
            if op == "admit":
                n += 1
                rid = f"p{n}"
                want = maths.admit(params, s, now, x, rid)
                got = await store.admit(key, x, rid, now_us=now)
                if want[0] == maths.WAIT:
                    wait_until = now + want[1]
                if want[0] == maths.ADMITTED:
                    admitted.append((key, rid))
            elif op == "release":
                if not admitted:
                    continue
                key, rid = admitted[x % len(admitted)]
                maths.release(model[key], rid)
                got = want = None
                store.release(key, rid)
                await store.pipe.drain()
            else:
                want = maths.refuse(params, s, now, x, y)  # type: ignore[assignment]
                r = await store.refuse(key, x, y, now_us=now)
                got = (r.answer, r.totals)  # type: ignore[assignment]
            assert got == want, (op, x, y)
            if want is not None:
                event(f"{op} answered {want[0]}")  # each answer is reached (statistics)
            for k in attempts:
                ttl = dict(model[k].ttl_ms)
                model[k].ttl_ms.clear()
                assert await stored(store, k) == model[k], k
                for name, path in zip(("bucket", "abuse", "flight"), store.keys(k),
                                      strict=True):
                    if name in ttl:  # this call set it: within a second of the maths
                        left = await store.client.pttl(path)
                        assert ttl[name] - 1000 < left <= ttl[name], (name, left, ttl)

    run(scenario, params)


P = Params.of(requests_per_s=10, request_burst=5, bytes_per_s=1000, byte_burst=2000,
              max_in_flight=2, abuse_refusals=3, abuse_window_s=60)


def test_a_burst_then_the_rate_and_bytes_and_requests_in_flight() -> None:
    """The in-memory budgets' own examples (test_gateway_budgets.py), in Redis."""
    async def scenario(store: FleetStore) -> None:
        a, b = ("a" * 32, 1), ("b" * 32, 1)
        for i in range(5):
            assert await store.admit(a, 10, f"r{i}", now_us=T0) == (maths.ADMITTED, 0)
            store.release(a, f"r{i}")
        assert await store.admit(a, 10, "r5", now_us=T0) == (maths.WAIT, 100_000)
        assert (await store.admit(b, 10, "s0", now_us=T0))[0] == maths.ADMITTED
        assert (await store.admit(a, 10, "r6", now_us=T0 + 100_000))[0] == maths.ADMITTED
        # Bytes: 2000 - 10 * 6 left; a 1,500-byte body takes them, the next one waits.
        c = ("c" * 32, 1)
        assert (await store.admit(c, 1500, "c0", now_us=T0))[0] == maths.ADMITTED
        assert await store.admit(c, 1500, "c1", now_us=T0) == (maths.WAIT, 1_000_000)
        assert (await store.admit(c, 100, "c2", now_us=T0))[0] == maths.ADMITTED
        assert await store.admit(c, 1, "c3", now_us=T0) == (maths.IN_FLIGHT, 100_000)
        store.release(c, "c0")
        assert (await store.admit(c, 1, "c4", now_us=T0))[0] == maths.ADMITTED

    run(scenario, P)


def test_a_hold_expires_on_its_own_and_a_failed_attempt_is_refused() -> None:
    async def scenario(store: FleetStore) -> None:
        a = ("d" * 32, 3)
        assert (await store.admit(a, 1, "x0", now_us=T0))[0] == maths.ADMITTED
        assert (await store.admit(a, 1, "x1", now_us=T0))[0] == maths.ADMITTED
        assert (await store.admit(a, 1, "x2", now_us=T0))[0] == maths.IN_FLIGHT
        # A gateway that died never releases them: they go when their hold ends.
        later = T0 + P.hold_us
        assert (await store.admit(a, 1, "x3", now_us=later))[0] == maths.ADMITTED
        answers = [(await store.refuse(a, "GATEWAY_BAD_REQUEST", 10**6, now_us=later)).answer
                   for _ in range(5)]
        assert answers == [maths.COUNTED] * 3 + [maths.TRIPPED, maths.ALREADY_FAILED]
        assert await store.admit(a, 1, "x4", now_us=later + 1) == (maths.FAILED, 0)
        # A failed attempt stays failed at least two minutes, whatever its token says.
        assert await store.admit(a, 1, "x5", now_us=later + maths.FAILED_MIN_US - 1) \
            == (maths.FAILED, 0)

    run(scenario, P)


def test_keys_of_an_attempt_share_a_slot_and_expire_when_idle() -> None:
    async def scenario(store: FleetStore) -> list[tuple[str, int]]:
        a = (uuid.uuid4().hex, 7)
        await store.admit(a, 100, "k0")  # Redis TIME
        await store.refuse(a, "GATEWAY_BAD_REQUEST", 10**6)
        return [(k, await store.client.pttl(k)) for k in store.keys(a)]

    keys = run(scenario, P)
    assert len({key_slot(k.encode()) for k, _ in keys}) == 1
    assert [k.rsplit(":", 1)[1] for k, _ in keys] == ["bucket", "abuse", "flight"]
    # Idle keys go within about a minute (plus what refilling or the hold still needs).
    assert all(0 < ttl <= maths.IDLE_MS + maths.HOLD_MS for _, ttl in keys), keys
    client = redis.Redis.from_url(TEST_REDIS_URL)
    try:
        assert not client.exists(*(k for k, _ in keys))  # deleted by the test's clean-up
    finally:
        client.close()


def test_params_hold_extreme_settings_within_exact_integers() -> None:
    p = Params.of(requests_per_s=1e12, request_burst=1e12, bytes_per_s=1e15, byte_burst=1e15,
                  max_in_flight=8, abuse_refusals=2**31 - 1, abuse_window_s=86400)
    values = [v for v in p.__dict__.values() if isinstance(v, int)]
    assert all(0 < v < maths.EXACT for v in values)
    assert (p.limit + 1) * p.window_ms < maths.EXACT
    tiny = Params.of(requests_per_s=1e-9, request_burst=1, bytes_per_s=1e-9, byte_burst=0.1,
                     max_in_flight=1, abuse_refusals=1, abuse_window_s=1e-9)
    assert (tiny.request_rate, tiny.byte_rate, tiny.window_ms, tiny.byte_cap) == (1, 1, 1, 1)
