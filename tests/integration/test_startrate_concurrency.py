"""Many clients on one bucket: threads and processes, each with its own connection.

The bound: the script serializes grants and spaces scheduled times at least one
interval T apart (T = 60_000 / rate ms, a whole number of ms for the rates used
here, and ceil() to ms keeps whole-ms gaps). So any half-open window [a, a + W)
holds at most ceil(W / T) = ceil(W * rate / 60_000) permits; that is asserted for
every window, not sampled.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import redis

from tasks.acquisition.startrate import RateRule, StartRateLimiter
from tests.support.helpers import eventually

PROCESSES = 3
THREADS = 4


def until_wall(t: float) -> None:
    delay = t - time.time()
    if delay > 0:
        time.sleep(delay)


def acquire_loop(redis_url: str, bucket: str, rules: list[RateRule], start: float,
                 stop: float) -> list[tuple[int, float]]:
    """Acquire as fast as allowed (no sleep on a grant: maximum contention)."""
    client = redis.Redis.from_url(redis_url)
    lim = StartRateLimiter(client)
    got: list[tuple[int, float]] = []
    until_wall(start)
    while time.time() < stop:
        permit = lim.acquire(bucket, rules)
        assert not permit.degraded
        if permit.granted:
            got.append((permit.scheduled_at_ms, permit.rate))
        else:
            time.sleep(permit.wait_ms / 1000)
    lim.close()
    client.close()
    return got


def penalize_once(redis_url: str, bucket: str, rules: list[RateRule], epoch: int,
                  start: float) -> bool:
    client = redis.Redis.from_url(redis_url)
    lim = StartRateLimiter(client)
    until_wall(start)
    applied = lim.penalize_detail(bucket, rules, epoch, cooldown_ms=50)
    assert not applied.degraded
    lim.close()
    client.close()
    return applied.applied


def run_everywhere(fn: Callable[..., object], *args: object) -> list[object]:
    """fn(*args) in PROCESSES processes and THREADS threads of this one, all at once.

    Returns the thread results first, then the process results.
    """
    ctx = multiprocessing.get_context("fork")  # children start before any thread here
    with ctx.Pool(PROCESSES) as pool:
        remote = [pool.apply_async(fn, args) for _ in range(PROCESSES)]
        with ThreadPoolExecutor(THREADS) as ex:
            local = [ex.submit(fn, *args) for _ in range(THREADS)]
            results = [f.result(timeout=30) for f in local]
        results += [r.get(timeout=30) for r in remote]
    return results


def max_in_window(times: list[int], width: int) -> int:
    """Largest number of times in any half-open window [a, a + width)."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - width:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def check_bound(times: list[int], interval_ms: int) -> None:
    times = sorted(times)
    assert min(b - a for a, b in itertools.pairwise(times)) >= interval_ms
    for width in (interval_ms, 35, 100, 250, 1000):
        assert max_in_window(times, width) <= math.ceil(width / interval_ms), width


def test_fixed_rate_never_exceeded_by_threads_and_processes(redis_url: str) -> None:
    rules = [RateRule("provider", 60, 600, 6, 6, 0.5, fixed_per_min=6000)]  # T = 10 ms
    start = time.time() + 0.3
    results = run_everywhere(acquire_loop, redis_url, f"c-{uuid.uuid4().hex}", rules,
                             start, start + 1.5)
    times = [t for got in results for t, _ in got]  # type: ignore[attr-defined]
    assert any(results[:THREADS]) and any(results[THREADS:])  # both kinds got permits
    check_bound(times, interval_ms=10)
    assert len(set(times)) == len(times) >= 2  # no slot granted twice (speed: bench/)


def test_adaptive_rate_never_exceeds_its_max_under_contention(redis_url: str) -> None:
    rules = [RateRule("provider", 3000, 6000, 60, 300, 0.5)]  # ramps to T = 10 ms
    start = time.time() + 0.3
    results = run_everywhere(acquire_loop, redis_url, f"c-{uuid.uuid4().hex}", rules,
                             start, start + 1.0)
    got = sorted(p for r in results for p in r)  # type: ignore[attr-defined]
    assert max(rate for _, rate in got) == 6000.0  # it did ramp
    check_bound([t for t, _ in got], interval_ms=10)


def test_concurrent_penalties_cut_once_per_epoch(redis_url: str) -> None:
    rules = [RateRule("provider", 600, 600, 6, 6, 0.5)]
    client = redis.Redis.from_url(redis_url)
    lim = StartRateLimiter(client)
    bucket = f"c-{uuid.uuid4().hex}"
    for round_ in range(3):
        epoch = lim.acquire(bucket, rules).epoch
        results = run_everywhere(penalize_once, redis_url, bucket, rules, epoch,
                                 time.time() + 0.2)
        assert sum(bool(r) for r in results) == 1
        (state,) = lim.inspect(bucket, rules)
        assert state.epoch == epoch + 1 == round_ + 1
        assert state.rate == 600 * 0.5 ** (round_ + 1)
    lim.close()
    client.close()


def test_threads_share_one_limiter_across_a_script_flush(redis_url: str) -> None:
    rules = [RateRule("provider", 60, 600, 6, 6, 0.5, fixed_per_min=12_000)]  # T = 5 ms
    client = redis.Redis.from_url(redis_url)
    lim = StartRateLimiter(client)
    bucket, stop = f"c-{uuid.uuid4().hex}", threading.Event()
    times: list[int] = []
    lock = threading.Lock()

    def loop() -> None:
        while not stop.is_set():
            p = lim.acquire(bucket, rules)
            if p.granted:
                with lock:
                    times.append(p.scheduled_at_ms)
            else:
                time.sleep(p.wait_ms / 1000)

    threads = [threading.Thread(target=loop) for _ in range(8)]
    for t in threads:
        t.start()
    eventually(lambda: len(times) >= 5, timeout=30, every=0.01, what="permits before")
    client.script_flush()  # mid-run: every thread's next EVALSHA meets NOSCRIPT
    flushed_at = len(times)
    eventually(lambda: len(times) >= flushed_at + 5, timeout=30, every=0.01,
               what="permits after the flush")
    stop.set()
    for t in threads:
        t.join()
    check_bound(times, interval_ms=5)
    assert lim.degraded_calls == 0 and 1 <= lim.script_loads <= 8
    lim.close()
    client.close()
