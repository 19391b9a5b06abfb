"""The start-rate bucket against real Redis: Lua == Python, wait_ms, expiry, NOSCRIPT, outages.

Differential approach: the scripts take an optional ARGV ``now_us`` (tests only; empty
in production, where Redis TIME is the clock), so hypothesis-generated arrival times
replay exactly through Lua and through ``maths`` and every reply and stored field must
match to the microsecond. Real-time tests use Redis TIME and poll to deadlines.
"""

from __future__ import annotations

import itertools
import logging
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tasks.acquisition.startrate import RateRule, StartRateLimiter, maths
from tasks.acquisition.startrate.maths import MPM, PPM, Params, Penalty, State

T0 = 1_796_000_000_000_000
LOGGER = "tasks.acquisition.startrate.bucket"
FAST = RateRule("provider", 6000, 6000, 6000, 0, 0.5)  # one permit per 10 ms


def fixed(per_min: float) -> RateRule:
    return RateRule("provider", 60, 600, 6, 6, 0.5, fixed_per_min=per_min)


def bucket() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def server_ms(client: redis.Redis) -> int:
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


def wait_for_server_ms(client: redis.Redis, target_ms: int, limit_s: float = 5.0) -> None:
    """Poll Redis TIME until it reaches target_ms (the deadline is the only wait)."""
    give_up = time.monotonic() + limit_s
    while server_ms(client) < target_ms:
        assert time.monotonic() < give_up
        time.sleep(0.0005)


@pytest.fixture
def limiter(redis_client: redis.Redis) -> Iterator[StartRateLimiter]:
    lim = StartRateLimiter(redis_client)
    yield lim
    lim.close()


def rule_of(name: str, p: Params, with_fixed: bool) -> RateRule:
    return RateRule(name, p.initial_mpm / MPM, p.max_mpm / MPM, p.floor_mpm / MPM,
                    p.increase_mpm / MPM, p.decrease_ppm / PPM,
                    p.fixed_mpm / MPM if with_fixed and p.fixed_mpm else None)


@st.composite
def params_st(draw: st.DrawFn) -> Params:
    floor = draw(st.integers(1_000, 120_000))
    initial = draw(st.integers(floor, floor * 4))
    maximum = draw(st.integers(initial, initial * 4))
    return Params(initial, maximum, floor, draw(st.integers(0, 40_000)),
                  draw(st.integers(1, PPM)), draw(st.sampled_from([0, 3_000, 90_000, 250_000])))


# When the next call happens: a plain clock step (it may go back a little, as after a
# failover), or exactly on / one microsecond around the boundaries the maths turns on.
when_st = st.one_of(
    st.tuples(st.just("step"), st.integers(-3_000, 4_000_000) | st.just(0)),
    st.tuples(st.sampled_from(["tat", "cool", "wait"]), st.integers(-1, 1)),
)
op_st = st.tuples(
    when_st,
    st.sampled_from(["acquire", "acquire", "penalize"]),
    st.integers(0, 3),  # successes / epoch offset / cooldown steps
    st.booleans(),  # operator override passed on this call
)


def next_now(now: int, when: tuple[str, int], states: list[State | None], wait_us: int) -> int:
    kind, v = when
    present = [s for s in states if s is not None]
    if kind == "step" or (kind != "wait" and not present):
        return now + v
    if kind == "tat":
        return max(s.tat_us for s in present) + v
    if kind == "cool":
        return max(s.cooldown_until_us for s in present) + v
    return wait_us + v


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    params=st.lists(params_st(), min_size=1, max_size=2),
    ops=st.lists(op_st, min_size=1, max_size=40),
    horizon_ms=st.sampled_from([0, 1, 333, 1000]),
    start=st.integers(0, 10**9),
)
def test_lua_and_python_decide_identically(
    redis_url: str, params: list[Params], ops: list[tuple[int, str, int, bool]],
    horizon_ms: int, start: int,
) -> None:
    client = redis.Redis.from_url(redis_url)
    now = [T0 + start]
    lim = StartRateLimiter(client, horizon_ms=horizon_ms, clock_us=lambda: now[0])
    names = [f"r{i}" for i in range(len(params))]
    b = bucket()
    states: list[State | None] = [None] * len(params)
    wait_us = now[0]  # where the last denial said to come back
    try:
        for when, op, n, override in ops:
            now[0] = next_now(now[0], when, states, wait_us)
            rules = [rule_of(name, p, override) for name, p in zip(names, params, strict=False)]
            ps = [maths.params_of(rule) for rule in rules]
            assert [p.fixed_mpm if override else 0 for p in params] == [p.fixed_mpm for p in ps]
            if op == "acquire":
                d, states = maths.acquire(ps, states, now[0], horizon_ms * 1000, n)
                got = lim.acquire(b, rules, observed_successes=n)
                if not d.granted:
                    wait_us = (d.server_now_ms + d.wait_ms) * 1000
                want: tuple[Any, ...] = (d.granted, d.scheduled_at_ms, d.server_now_ms,
                                         d.wait_ms, d.rate_mpm, d.epoch, False)
            else:
                epoch = max((s or maths.fresh(p)).epoch for p, s in zip(ps, states, strict=False))
                permit_epoch = epoch + n - 1
                c, states = maths.penalize(ps, states, now[0], permit_epoch, n * 700_000)
                got = lim.penalize_detail(b, rules, permit_epoch, n * 700)
                want = (c.applied, c.rate_mpm, c.epoch, c.cooldown_until_ms, c.server_now_ms,
                        False)
            fields = tuple(round(v * MPM) if isinstance(v, float) else v
                           for v in got.__dict__.values())
            assert fields == want, (op, got, want)
            stored = [None if not r.exists else
                      State(round(r.adaptive_rate * MPM), r.tat_us, r.epoch, r.cooldown_until_us)
                      for r in lim.inspect(b, rules)]
            assert stored == states
    finally:
        client.delete(*(lim.key(b, name) for name in names))
        lim.close()
        client.close()


def test_key_layout_one_slot_and_idle_ttl(redis_client: redis.Redis) -> None:
    lim = StartRateLimiter(redis_client, idle_ttl_ms=60_000)
    b = bucket()
    rules = [FAST, RateRule("global", 600, 600, 600, 0, 1.0)]
    assert lim.acquire(b, rules).granted
    keys = sorted(k.decode() for k in redis_client.scan_iter(match=f"*{{{b}}}*"))
    assert keys == [f"playrun:startrate:{{{b}}}:rule:global",
                    f"playrun:startrate:{{{b}}}:rule:provider"]
    assert len({key_slot(k.encode()) for k in keys}) == 1
    assert all(59_000 < redis_client.pttl(k) <= 60_000 + 100 for k in keys)
    lim.close()


def test_wait_ms_is_exact_on_the_server_clock(redis_client: redis.Redis) -> None:
    now = [T0 + 777]
    lim = StartRateLimiter(redis_client, horizon_ms=40, clock_us=lambda: now[0])
    b = bucket()
    assert lim.acquire(b, [FAST]).granted
    for _ in range(20):
        d = lim.acquire(b, [FAST])
        if d.granted:
            continue
        now[0] = (d.server_now_ms + d.wait_ms - 1) * 1000
        assert not lim.acquire(b, [FAST]).granted  # one ms earlier is too early
        now[0] = (d.server_now_ms + d.wait_ms) * 1000
        assert lim.acquire(b, [FAST]).granted
    lim.close()


def test_wait_ms_is_enough_in_real_time(redis_client: redis.Redis, limiter: StartRateLimiter,
                                        ) -> None:
    limiter.horizon_ms = 50
    rules, b = [fixed(300)], bucket()  # one permit per 200 ms
    assert limiter.acquire(b, rules).granted
    for _ in range(4):
        d = limiter.acquire(b, rules)
        assert not d.granted and 100 <= d.wait_ms <= 201  # 200 - horizon .. 200, +1 ms
        wait_for_server_ms(redis_client, d.server_now_ms + d.wait_ms)
        assert limiter.acquire(b, rules).granted


def test_nothing_granted_during_cooldown(redis_client: redis.Redis,
                                         limiter: StartRateLimiter) -> None:
    b = bucket()
    first = limiter.acquire(b, [FAST])
    cut = limiter.penalize_detail(b, [FAST], first.epoch, cooldown_ms=300)
    assert cut.applied and cut.cooldown_until_ms >= cut.server_now_ms + 300
    while True:
        d = limiter.acquire(b, [FAST])
        if d.granted:
            break
        assert d.server_now_ms < cut.cooldown_until_ms
        assert d.server_now_ms + d.wait_ms >= cut.cooldown_until_ms
        wait_for_server_ms(redis_client, d.server_now_ms + d.wait_ms)
    assert d.server_now_ms >= cut.cooldown_until_ms and d.epoch == first.epoch + 1


def test_stale_epoch_penalty_counts_once(limiter: StartRateLimiter) -> None:
    rule, b = RateRule("provider", 600, 600, 6, 6, 0.5), bucket()
    epoch = limiter.acquire(b, [rule]).epoch
    assert limiter.penalize(b, [rule], epoch, 0)
    assert not limiter.penalize(b, [rule], epoch, 0)
    (state,) = limiter.inspect(b, [rule])
    assert (state.rate, state.epoch) == (300.0, epoch + 1)
    for _ in range(12):  # rate stays at or above the floor
        limiter.penalize(b, [rule], limiter.inspect(b, [rule])[0].epoch, 0)
    assert limiter.inspect(b, [rule])[0].rate == 6.0


def test_short_real_time_ramp_matches_formula(limiter: StartRateLimiter,
                                              redis_client: redis.Redis) -> None:
    rule, b = RateRule("provider", 600, 1200, 60, 60, 0.5), bucket()
    limiter.horizon_ms = 100
    first_raise = None
    while True:
        d = limiter.acquire(b, [rule])
        if not d.granted:
            wait_for_server_ms(redis_client, d.server_now_ms + d.wait_ms)
            continue
        if first_raise is None and d.rate > 600:
            first_raise = d.scheduled_at_ms
        if d.rate == 1200:
            break
    assert first_raise is not None
    took, formula = (d.scheduled_at_ms - first_raise) / 1000, maths.ramp_seconds(600, 1200, 60)
    assert abs(took - formula) <= 0.10 * formula, (took, formula)


def test_override_caps_growth_and_keeps_adaptive_state(limiter: StartRateLimiter) -> None:
    adaptive, b = RateRule("provider", 600, 6000, 6, 60, 0.5), bucket()
    for _ in range(4):
        limiter.acquire(b, [adaptive])
    kept = limiter.inspect(b, [adaptive])[0].adaptive_rate
    assert kept == 780.0  # three busy grants of +60
    override = RateRule(**{**adaptive.__dict__, "fixed_per_min": 120})
    permits = [limiter.acquire(b, [override]) for _ in range(10)]
    assert {p.rate for p in permits} == {120.0}
    assert limiter.inspect(b, [adaptive])[0].adaptive_rate == kept


def test_global_rule_binds_and_a_denial_reserves_nothing(limiter: StartRateLimiter) -> None:
    provider, cap, b = FAST, RateRule("global", 120, 120, 120, 0, 1.0), bucket()
    limiter.horizon_ms = 0
    assert limiter.acquire(b, [provider, cap]).granted
    before = limiter.inspect(b, [provider, cap])
    d = limiter.acquire(b, [provider, cap])
    assert not d.granted and 490 <= d.wait_ms <= 501 and d.rate == 120.0
    after = limiter.inspect(b, [provider, cap])
    assert [s.tat_us for s in after] == [s.tat_us for s in before]


def test_idle_keys_expire_and_restart_at_initial_rate(redis_client: redis.Redis) -> None:
    lim = StartRateLimiter(redis_client, idle_ttl_ms=100)
    rule, b = RateRule("provider", 6000, 12000, 60, 600, 0.5), bucket()
    epoch = lim.acquire(b, [rule]).epoch
    assert lim.penalize(b, [rule], epoch, cooldown_ms=0)
    assert lim.inspect(b, [rule])[0].rate == 3000.0
    key = lim.key(b, "provider")
    assert 0 < redis_client.pttl(key) <= 100 + 10
    give_up = time.monotonic() + 3
    while redis_client.exists(key):
        assert time.monotonic() < give_up
        time.sleep(0.005)
    permit = lim.acquire(b, [rule])
    assert permit.granted and not permit.degraded and permit.rate == 6000.0
    assert permit.epoch == 0
    lim.close()


def test_lost_keys_restart_at_initial_rate_in_redis(redis_client: redis.Redis,
                                                    limiter: StartRateLimiter) -> None:
    rule, b = RateRule("provider", 600, 6000, 6, 60, 0.5), bucket()
    for _ in range(5):
        limiter.acquire(b, [rule])
    redis_client.delete(limiter.key(b, "provider"))
    permit = limiter.acquire(b, [rule])
    assert permit.granted and not permit.degraded and permit.rate == 600.0


def test_script_flush_mid_run_reloads_once(redis_client: redis.Redis,
                                           limiter: StartRateLimiter) -> None:
    rule, b = fixed(60_000), bucket()
    assert not limiter.acquire(b, [rule]).degraded
    redis_client.script_flush()
    for _ in range(5):
        assert not limiter.acquire(b, [rule]).degraded
    assert limiter.script_loads == 1
    assert not limiter.penalize_detail(b, [rule], 0, 0).degraded
    assert not limiter.inspect(b, [rule])[0].degraded
    assert limiter.script_loads == 3  # once per script, then cached again
    assert limiter.degraded_calls == 0


class ScriptedClient:
    """A client whose EVALSHA answers come from a list: an exception class or a reply."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.evalsha_calls = 0
        self.loads = 0

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: str) -> Any:
        self.evalsha_calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, type):
            raise answer("scripted")
        return answer

    def script_load(self, script: str) -> Any:
        self.loads += 1
        return "sha"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_timeout_is_never_resent() -> None:
    clock = Clock()
    fake = ScriptedClient(RedisTimeoutError, b"1 5 5 0 60000 0")
    lim = StartRateLimiter(fake, monotonic=clock, breaker_ms=1000)
    permit = lim.acquire("b", [FAST])
    assert permit.degraded and permit.granted
    assert (fake.evalsha_calls, fake.loads) == (1, 0)
    assert lim.acquire("b", [FAST]).degraded  # the breaker skips Redis for a second
    assert fake.evalsha_calls == 1
    clock.t += 1.5
    assert not lim.acquire("b", [FAST]).degraded
    assert fake.evalsha_calls == 2


def test_noscript_reloads_once_then_a_timeout_stops() -> None:
    fake = ScriptedClient(NoScriptError, RedisTimeoutError)
    lim = StartRateLimiter(fake)
    assert lim.acquire("b", [FAST]).degraded
    assert (fake.evalsha_calls, fake.loads) == (2, 1)
    fake = ScriptedClient(NoScriptError, NoScriptError)
    lim = StartRateLimiter(fake)
    assert lim.acquire("b", [FAST]).degraded  # no reload loop
    assert (fake.evalsha_calls, fake.loads) == (2, 1)


@pytest.mark.parametrize("odd", [b"1 5 5 0", b"granted", [1, 5, 5, 0, 60_000, 0], None])
def test_an_odd_reply_degrades_once_with_its_code_and_is_not_resent(
    odd: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    fake = ScriptedClient(odd, b"1 5 5 0 60000 0")
    lim = StartRateLimiter(fake)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        permit = lim.acquire("b", [FAST])
    assert permit.degraded and fake.evalsha_calls == 1
    assert "START_RATE_REPLY_INVALID" in caplog.text
    again = lim.acquire("b", [FAST])  # no breaker: the next call asks Redis again
    assert not again.degraded and (again.scheduled_at_ms, again.rate) == (5, 60.0)


def test_a_penalty_answered_with_a_line_is_odd() -> None:
    fake = ScriptedClient(b"1 60000 1 5 5", [1, 60_000, 1, 5, 5])
    lim = StartRateLimiter(fake)
    assert lim.penalize_detail("b", [FAST], 0, 0).degraded and fake.evalsha_calls == 1
    assert lim.penalize_detail("b", [FAST], 0, 0) == Penalty(True, 60.0, 1, 5, 5)


def test_the_limiter_client_has_no_command_retries(redis_url: str) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    client = redis.Redis(host="127.0.0.1", port=port)  # redis-py default: 10 retries
    assert client.get_retry() is not None and client.get_retry().get_retries() > 0
    lim = StartRateLimiter(client)
    own = lim._client
    assert isinstance(own, redis.Redis)
    assert own.connection_pool.connection_kwargs["retry"].get_retries() == 0
    assert own.connection_pool.connection_kwargs["socket_timeout"] <= 2.0
    lim.close()
    client.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_redis_down_gives_degraded_permits_at_initial_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, now = Clock(), [T0]
    client = redis.Redis(host="127.0.0.1", port=closed_port())
    lim = StartRateLimiter(client, monotonic=clock, clock_us=lambda: now[0], breaker_ms=0)
    rule = RateRule("provider", 60, 600, 6, 6, 0.5)
    granted = []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(30):
            permit = lim.acquire("daytona", [rule])
            assert permit.degraded and permit.rate == 60.0
            if permit.granted:
                granted.append(permit.scheduled_at_ms)
            else:
                now[0] = (permit.server_now_ms + permit.wait_ms) * 1000
                clock.t += permit.wait_ms / 1000
        assert lim.penalize("daytona", [rule], 99, 0) is True  # local epoch; never raises
        assert lim.inspect("daytona", [rule])[0].degraded
        assert {b - a for a, b in itertools.pairwise(granted)} == {1000}
        assert len(granted) >= 10
        first = [r for r in caplog.records if r.name == LOGGER]
        assert len(first) == 1  # ~20 s of failures: one warning
        clock.t += 61
        lim.acquire("daytona", [rule])
        assert len([r for r in caplog.records if r.name == LOGGER]) == 2
    lim.close()


def test_redis_down_real_clock_degrades_every_call() -> None:
    """How fast that is, is measured in bench/, not asserted here."""
    lim = StartRateLimiter(redis.Redis(host="127.0.0.1", port=closed_port()))
    permits = [lim.acquire("x", [FAST]) for _ in range(200)]
    assert all(p.degraded for p in permits) and any(p.granted for p in permits)
    lim.close()
