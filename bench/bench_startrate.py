"""Start-rate bucket: decisions/s against the `limits` library's moving window, and
accuracy under contention.

    python bench/bench_startrate.py [--redis redis://127.0.0.1:6379/14]

Without --redis it claims a free bench db (12-15) as the other benches do, so two
benches never flush or share each other's keys.

(1) Throughput, side by side on the same Redis: the acquire script (grant path, deny
    path, two rules) against the `limits` library's Redis moving-window `hit()` (its
    script, as `hit()` sends it, with the same arguments; granted, and denied), a trivial
    ``return 1`` script and the three-call floor, pipelined (N calls in pipelines of 100)
    and one call at a time from Python (latency p50/p99 in us); the Python calls
    `limiter.acquire()` and `MovingWindowRateLimiter.hit()` side by side. The goal:
    acquire >= 1.0x limits' hit, both ways.
(2) Accuracy: several processes race for 10,000 permits from one bucket with a fixed
    override (so the rate is known); every window must hold at most ceil(W / T) permits.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from limits import RateLimitItemPerMinute
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import REDIS_BASE, claim_redis_db
from tasks.acquisition.startrate import RateRule, StartRateLimiter
from tasks.acquisition.startrate.bucket import load_script

TRIVIAL = "return 1"
# What any acquire must do at least: read the shared clock, read one rule, write it back.
FLOOR = ("local t = redis.call('TIME') "
         "redis.call('HMGET', KEYS[1], 'r', 't', 'e', 'c', 'x') "
         "redis.call('HSET', KEYS[1], 't', t[1] * 1000000 + t[2]) "
         "return {ok = '1 0 0 0 0 0'}")
FAST = RateRule("provider", 60, 600, 6, 6, 0.5, fixed_per_min=1_000_000)  # 60 us apart
CAP = RateRule("global", 1_000_000, 1_000_000, 1_000_000, 0, 1.0)
SLOW = RateRule("provider", 60, 600, 6, 6, 0.5, fixed_per_min=1)  # one grant: a minute ahead


def acquire_argv(lim: StartRateLimiter, bucket: str,
                 rules: list[RateRule]) -> tuple[bytes, list[bytes]]:
    """The SHA and KEYS + ARGV that ``lim.acquire(bucket, rules)`` sends, as it sends them."""
    return load_script("acquire").sha_bytes, list(lim._acquire_args(bucket, rules, 1))


def pipelined(client: redis.Redis, calls: list[tuple[str | bytes, int, list[bytes]]], n: int,
              batch: int) -> list[float]:
    """Calls per second of each (sha, numkeys, args), pipelines of ``batch`` without MULTI.

    The variants take turns, one pipeline each, so that all see the same machine noise
    (this host is shared).
    """
    spent = [0.0] * len(calls)
    for _ in range(n // batch):
        for i, (sha, numkeys, args) in enumerate(calls):
            started = time.perf_counter()
            pipe = client.pipeline(transaction=False)
            for _ in range(batch):
                pipe.evalsha(sha, numkeys, *args)
            pipe.execute()
            spent[i] += time.perf_counter() - started
    return [n // batch * batch / s for s in spent]


def per_call(fn: Callable[[], object], n: int,
             base: Callable[[], object] | None = None) -> tuple[float, float, float]:
    """(calls/s, p50 us, p99 us) one call at a time.

    With ``base``, its calls are interleaved one for one so that both see the same
    machine noise (this host is shared); only ``fn``'s samples are reported.
    """
    samples = []
    for _ in range(n):
        if base is not None:
            base()
        t = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t) / 1000)
    q = statistics.quantiles(samples, n=100)
    return 1e6 / statistics.fmean(samples), q[49], q[98]


def pair(fa: Callable[[], object], fb: Callable[[], object], n: int
         ) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """per_call of both, their calls interleaved one for one (B, A, B, A, ...), so that
    both see the same machine noise."""
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(n):
        for fn, out in ((fb, samples[1]), (fa, samples[0])):
            t = time.perf_counter_ns()
            fn()
            out.append((time.perf_counter_ns() - t) / 1000)

    def stats(xs: list[float]) -> tuple[float, float, float]:
        q = statistics.quantiles(xs, n=100)
        return 1e6 / statistics.fmean(xs), q[49], q[98]

    return stats(samples[0]), stats(samples[1])


def limits_call(client: redis.Redis, storage: RedisStorage, ident: str,
                per_min: int) -> tuple[bytes, list[Any]]:
    """The SHA and KEYS + ARGV `MovingWindowRateLimiter.hit()` sends (limits' Redis
    storage: its `acquire_moving_window` script, the client's clock, limit, expiry, 1)."""
    item = RateLimitItemPerMinute(per_min)
    script = storage.lua_acquire_moving_window
    client.script_load(script.script)
    key = storage.prefixed_key(item.key_for(ident))
    return script.sha.encode(), [key, time.time(), item.amount, item.get_expiry(), 1]


def throughput(url: str, n: int, batch: int, calls: int) -> None:
    client = redis.Redis.from_url(url)
    trivial_sha = client.script_load(TRIVIAL)
    floor_sha = client.script_load(FLOOR)
    for name in ("acquire", "penalize", "inspect"):
        client.script_load(load_script(name).body)
    lim = StartRateLimiter(client, horizon_ms=3_600_000)  # grant path: nothing is refused
    deny = StartRateLimiter(client, horizon_ms=0)
    storage = RedisStorage(url)
    window = MovingWindowRateLimiter(storage)
    b = f"bench-{uuid.uuid4().hex[:8]}"

    def bare() -> object:
        return client.evalsha(trivial_sha, 0)

    grant = acquire_argv(lim, b + "-g", [FAST])
    deny_call = acquire_argv(deny, b + "-d", [SLOW])
    two = acquire_argv(lim, b + "-2", [FAST, CAP])
    lim.acquire(b + "-d", [SLOW])  # a minute ahead now: every later call is denied
    floor_args = [lim.key(b + "-f", FAST.name), grant[1][1]]  # a key of its own, as packed
    # limits: 1,000,000/min granted (the window keeps every hit, as many as the calls);
    # 1/min denied after its first hit.
    l_grant = limits_call(client, storage, b + "-lg", 1_000_000)
    l_deny = limits_call(client, storage, b + "-ld", 1)
    window.hit(RateLimitItemPerMinute(1), b + "-ld")
    rates = pipelined(client, [(trivial_sha, 0, []), (grant[0], 1, grant[1]),
                               (deny_call[0], 1, deny_call[1]), (two[0], 2, two[1]),
                               (floor_sha, 1, floor_args), (l_grant[0], 1, l_grant[1]),
                               (l_deny[0], 1, l_deny[1])], n, batch)
    base_pipe = rates[0]
    base = per_call(bare, calls, base=bare)
    item = RateLimitItemPerMinute(1_000_000)

    def raw(call: tuple[bytes, list[Any]], numkeys: int = 1) -> Callable[[], object]:
        return lambda: client.evalsha(call[0], numkeys, *call[1])

    # (acquire, limits) pairs, each measured call for call against the other.
    g_acq, g_lim = pair(raw(grant), raw(l_grant), calls)
    d_acq, d_lim = pair(raw(deny_call), raw(l_deny), calls)
    p_acq, p_lim = pair(lambda: lim.acquire(b + "-p", [FAST]),
                        lambda: window.hit(item, b + "-lp"), calls)
    print(f"\n(1) throughput: {n} EVALSHA pipelined by {batch} (variants take turns); "
          f"{calls} single calls, interleaved one for one with limits' (x limits) or with "
          "bare ones; per-call/s = 1 / mean latency")
    print(f"{'script':<28}{'pipelined/s':>12}{'x bare':>7}{'x limits':>9}{'per-call/s':>11}"
          f"{'x limits':>9}{'p50 us':>7}{'x limits':>9}{'p99 us':>7}")

    def row(name: str, pipe_rate: float | None, single: tuple[float, float, float],
            l_pipe: float | None = None, l_single: tuple[float, float, float] | None = None
            ) -> None:
        pipe = "-" if pipe_rate is None else f"{pipe_rate:,.0f}"
        pipe_x = "-" if pipe_rate is None else f"{pipe_rate / base_pipe:.2f}"
        lp = "-" if l_pipe is None or pipe_rate is None else f"{pipe_rate / l_pipe:.2f}"
        ls = "-" if l_single is None else f"{single[0] / l_single[0]:.2f}"
        l50 = "-" if l_single is None else f"{l_single[1] / single[1]:.2f}"
        print(f"{name:<28}{pipe:>12}{pipe_x:>7}{lp:>9}{single[0]:>11,.0f}{ls:>9}"
              f"{single[1]:>7.0f}{l50:>9}{single[2]:>7.0f}")

    row("return 1 (bare EVALSHA)", base_pipe, base)
    row("limits hit, grant (raw)", rates[5], g_lim)
    row("limits hit, deny (raw)", rates[6], d_lim)
    row("acquire, grant (raw)", rates[1], g_acq, rates[5], g_lim)
    row("acquire, deny (raw)", rates[2], d_acq, rates[6], d_lim)
    row("acquire, 2 rules (raw)", rates[3], per_call(raw(two, 2), calls, base=bare),
        rates[5])
    row("floor: TIME, HMGET, HSET", rates[4],
        per_call(lambda: client.evalsha(floor_sha, 1, *floor_args), calls, base=bare), rates[5])
    row("limits hit() (Python)", None, p_lim)
    row("limiter.acquire() (Python)", None, p_acq, None, p_lim)
    assert lim.degraded_calls == 0 and deny.degraded_calls == 0
    for suffix in ("-g", "-d", "-2", "-p", "-f"):
        client.delete(*(lim.key(b + suffix, r.name) for r in (FAST, CAP, SLOW)))
    client.delete(l_grant[1][0], l_deny[1][0], storage.prefixed_key(item.key_for(b + "-lp")))
    lim.close()
    deny.close()
    client.close()


def race(url: str, bucket: str, rules: list[RateRule], want: int, start: float,
         ) -> tuple[list[int], int]:
    client = redis.Redis.from_url(url)
    lim = StartRateLimiter(client)
    got: list[int] = []
    denied = 0
    time.sleep(max(0.0, start - time.time()))
    while len(got) < want:
        permit = lim.acquire(bucket, rules)
        if permit.degraded:
            raise RuntimeError("degraded permit during the accuracy run")
        if permit.granted:
            got.append(permit.scheduled_at_ms)
        else:
            denied += 1
            time.sleep(permit.wait_ms / 1000)
    lim.close()
    return got, denied


def max_in_window(times: list[int], width: int) -> int:
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - width:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def accuracy(url: str, permits: int, procs: int, per_min: float) -> None:
    rules = [RateRule("provider", 60, 600, 6, 6, 0.5, fixed_per_min=per_min)]
    interval_ms = 60_000 / per_min
    bucket = f"bench-acc-{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("fork")
    start = time.time() + 0.5
    with ctx.Pool(procs) as pool:
        parts = pool.starmap(race, [(url, bucket, rules, permits // procs, start)] * procs)
    elapsed = time.time() - start
    times = sorted(t for got, _ in parts for t in got)
    denied = sum(d for _, d in parts)
    print(f"\n(2) accuracy: {len(times)} permits, {procs} processes, fixed {per_min:,.0f}/min "
          f"(T = {interval_ms:g} ms), {denied} denials, {elapsed:.1f} s")
    print(f"{'window ms':>10}{'allowed':>9}{'max seen':>10}{'excess':>8}")
    worst = 0
    for width in (1, 2, 10, 100, 1000, 5000):
        allowed = math.ceil(width / interval_ms)
        seen = max_in_window(times, width)
        worst = max(worst, seen - allowed)
        print(f"{width:>10}{allowed:>9}{seen:>10}{seen - allowed:>8}")
    span_s = (times[-1] - times[0]) / 1000
    print(f"achieved {(len(times) - 1) / span_s * 60:,.0f}/min over {span_s:.2f} s of schedule;"
          f" largest excess over any window: {max(0, worst)}")
    client = redis.Redis.from_url(url)
    client.delete(f"playrun:startrate:{{{bucket}}}:rule:provider")
    client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis", default=None, help="a Redis URL with its db (default: a "
                    "free bench db)")
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--pipeline", type=int, default=100)
    ap.add_argument("--single", type=int, default=5_000)
    ap.add_argument("--permits", type=int, default=10_000)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--per-min", type=float, default=60_000)
    a = ap.parse_args()
    url = a.redis or f"{REDIS_BASE}/{claim_redis_db(REDIS_BASE, 14)}"
    info = redis.Redis.from_url(url).info("server")
    print(f"redis {info['redis_version']} at {url}; redis-py {redis.__version__}")
    throughput(url, a.calls, a.pipeline, a.single)
    accuracy(url, a.permits, a.procs, a.per_min)


if __name__ == "__main__":
    main()
