"""Start-rate acquire on a three-primary Redis Cluster against one redis-server.

    python bench/bench_redis_topologies.py [--calls 3000] [--procs 8] [--seconds 3]

Both servers are private (tasks/testing/topologies.py: redis-server on free loopback
ports, stopped at the end), the same binary and settings but cluster mode.

(1) One process, one call at a time: `limiter.acquire()` on the cluster (a RedisCluster
    client: the bucket's two keys share a slot) and on the single server, interleaved
    call for call so both see the same machine noise; calls/s and p50/p99.
(2) `--procs` processes for `--seconds` each on one bucket at an unbounded rate (every
    call a decision): decisions/s in all, cluster against single, rounds taking turns.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from redis.backoff import NoBackoff
from redis.retry import Retry

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tasks.acquisition.startrate import RateRule, StartRateLimiter
from tasks.store import redisconn
from tasks.testing.topologies import Cluster, Node

FAST = RateRule("provider", 60, 600, 6, 6, 0.5, fixed_per_min=1_000_000)
CAP = RateRule("global", 1_000_000, 1_000_000, 1_000_000, 0, 1.0)


def limiter(url: str) -> StartRateLimiter:
    retry = {"retry": Retry(NoBackoff(), 0)} if url.startswith("redis+cluster") else {}
    client = redisconn.script_client(url, socket_timeout=2.0, **retry)
    return StartRateLimiter(client, horizon_ms=3_600_000)  # grant path: nothing refused


def timed(lim: StartRateLimiter, bucket: str) -> float:
    t = time.perf_counter_ns()
    lim.acquire(bucket, [FAST, CAP], observed_successes=0)
    return (time.perf_counter_ns() - t) / 1000


def one_process(single: str, cluster: str, calls: int) -> None:
    a, b = limiter(single), limiter(cluster)
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(calls):
        samples[0].append(timed(a, bucket))
        samples[1].append(timed(b, bucket))
    assert a.degraded_calls == 0 and b.degraded_calls == 0, "a call degraded"
    print(f"\n(1) one process, {calls} acquires each (2 rules), interleaved")
    rates = []
    for name, s in zip(("single", "cluster"), samples, strict=True):
        q = statistics.quantiles(s, n=100)
        rates.append(1e6 / statistics.fmean(s))
        print(f"{name:<8} {rates[-1]:>8,.0f}/s  p50 {q[49]:>5.0f} us  p99 {q[98]:>6.0f} us")
    print(f"cluster / single: {rates[1] / rates[0]:.2f}")


def _worker(url: str, bucket: str, seconds: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    lim = limiter(url)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        lim.acquire(bucket, [FAST, CAP], observed_successes=0)
        n += 1
    out.put((n, lim.degraded_calls))


def contended(url: str, procs: int, seconds: float) -> float:
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    ps = [multiprocessing.Process(target=_worker, args=(url, bucket, seconds, out))
          for _ in range(procs)]
    for p in ps:
        p.start()
    got = [out.get(timeout=seconds + 60) for _ in ps]
    for p in ps:
        p.join()
    assert all(d == 0 for _, d in got), "a call degraded"
    return float(sum(n for n, _ in got)) / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-topologies-") as tmp:
        node = Node(Path(tmp), "single", [])
        cluster = Cluster(Path(tmp))
        try:
            node.start().wait_ready()
            cluster.start()
            single = f"redis://127.0.0.1:{node.port}/0"
            one_process(single, cluster.url(), args.calls)
            print(f"\n(2) {args.procs} processes x {args.seconds:g} s on one bucket, "
                  "rounds taking turns")
            for r in range(args.rounds):
                a = contended(single, args.procs, args.seconds)
                b = contended(cluster.url(), args.procs, args.seconds)
                print(f"round {r + 1}: single {a:,.0f}/s  cluster {b:,.0f}/s  "
                      f"ratio {b / a:.2f}")
        finally:
            cluster.stop()
            node.stop()


if __name__ == "__main__":
    main()
