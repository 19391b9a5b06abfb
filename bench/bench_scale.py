"""How cost grows: the admission and capacity figures and every periodic job's time per
batch, with 10k, 100k and 1M ended runs (10 ledger events each) in the database.

    python bench/bench_scale.py [--sizes 10000,100000,1000000] [--events 10]

A fresh database is created, migrated (Alembic) and filled in SQL (bench/scale_load.py):
ended runs with attempts, leases, sandboxes, outbox rows and events; an outbox backlog of
100,000 unsent rows (half due now, half deferred to tomorrow); one run with 100,000
events. Each figure is the median over several batches; the last column is the largest
size's figure over the smallest's (flat is about 1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import scale_load
from bench.common import bench_env
from bench.common import capacity_cycle as one_cycle

NOOP = Path(__file__).resolve().parent.parent / "examples" / "plays" / "noop.py"
Row = tuple[str, str, Callable[[], float]]  # (what, unit, one sample)


def median_of(sample: Callable[[], float], n: int) -> float:
    return statistics.median(sample() for _ in range(n))


def timed(fn: Callable[[], object], per: int = 1) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000 / per


def rows(env: dict[str, str], long_run: str) -> list[tuple[str, str, float]]:
    import tasks
    from tasks.acquisition import capacity
    from tasks.acquisition.claim import Claimed, claim
    from tasks.acquisition.startrate import RateRule, StartRateLimiter
    from tasks.admission.relay import publish_due, resend_stale
    from tasks.constants import LABEL_GENERATION, LABEL_RUN, QUEUE
    from tasks.maintenance.gc import verdict
    from tasks.maintenance.reaper import expire_reservations, reap
    from tasks.sandbox import SandboxRef
    from tasks.settings import get_settings
    from tasks.store import redisconn
    from tasks.store.db import session_scope

    settings = get_settings()
    broker = redisconn.client(env["PLAYRUN_REDIS_URL"])
    n = [0]

    def submit_one() -> float:
        return timed(lambda: [tasks.submit_run(NOOP, org_id="scale-new") for _ in range(20)], 20)

    def submit_batch() -> float:
        return timed(lambda: tasks.submit_runs([{"play": NOOP, "org_id": "scale-new"}] * 100),
                     100)

    capacity.set_limit("scale-cap", 10)
    run_id = tasks.submit_run(NOOP, org_id="scale-cap").id
    with session_scope() as session:
        claimed = claim(session, run_id, worker_id="bench", lease_seconds=3600)
    assert isinstance(claimed, Claimed)
    fence = claimed.fence

    def capacity_cycle() -> float:
        def cycle() -> None:
            n[0] += 1
            one_cycle(fence, "scale-cap", settings, f"sb-{n[0]}")
        return timed(lambda: [cycle() for _ in range(10)], 10)

    limiter = StartRateLimiter(broker, horizon_ms=3_600_000)
    rule = [RateRule("provider", 60, 600, 6, 6, 0.5, fixed_per_min=1_000_000)]

    def acquire() -> float:
        return timed(lambda: [limiter.acquire("scale", rule) for _ in range(200)], 200) * 1000

    def page(after: int | None) -> Callable[[], float]:
        return lambda: timed(lambda: tasks.run_events(long_run, after=after, limit=1000))

    def sweep() -> float:
        ms = timed(lambda: publish_due(limit=200))
        broker.delete(QUEUE)
        return ms

    def resend() -> float:
        ms = timed(lambda: resend_stale(after_s=0, limit=200))
        broker.delete(QUEUE)
        return ms

    refs = [SandboxRef("fake", f"sb-{i}", {LABEL_RUN: scale_load_run(i), LABEL_GENERATION: "1"},
                       0.0) for i in range(1, 201)]

    def gc() -> float:
        return timed(lambda: [verdict(ref) for ref in refs])

    def reaper_pass() -> float:
        ms = timed(lambda: reap(settings))
        broker.delete(QUEUE)
        return ms

    def expire() -> float:
        return timed(lambda: expire_reservations(200))

    seqs = [e.seq for e in tasks.run_events(long_run, limit=1)]
    middle = seqs[0] + 50_000
    last = seqs[0] + 99_000
    measured: list[tuple[str, str, Callable[[], float], int]] = [
        ("submit_run", "ms/run", submit_one, 5),
        ("submit_runs, batches of 100", "ms/run", submit_batch, 5),
        ("capacity reserve+promote+release", "ms/cycle", capacity_cycle, 5),
        ("bucket acquire (Redis)", "us/call", acquire, 3),
        ("run_events, first 1000 of 100k", "ms/page", page(None), 5),
        ("run_events, 1000 after 50k", "ms/page", page(middle), 5),
        ("run_events, last 1000", "ms/page", page(last), 5),
        ("outbox sweep (200 due of 50k; 50k deferred)", "ms/batch", sweep, 5),
        ("outbox resend of long-queued runs", "ms/batch", resend, 3),
        ("reaper: expire reservations", "ms/batch", expire, 3),
        ("reaper: one whole pass", "ms/pass", reaper_pass, 3),
        ("sandbox GC: verdicts", "ms/200", gc, 5),
    ]
    out = []
    for what, unit, sample, reps in measured:
        sample()  # warm
        out.append((what, unit, median_of(sample, reps)))
    limiter.close()
    broker.close()
    return out


def scale_load_run(i: int) -> str:
    import hashlib

    return hashlib.md5(f"r{i}".encode()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--events", type=int, default=10)
    ap.add_argument("--backlog", type=int, default=100_000)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with bench_env(redis_db=12) as env:
        url = env["PLAYRUN_DATABASE_URL"]
        scale_load.bundle(url)
        scale_load.backlog(url, args.backlog // 2, args.backlog - args.backlog // 2)
        long_run = scale_load.long_ledger(url, 100_000)
        table: dict[str, list[float]] = {}
        units: dict[str, str] = {}
        done = 0
        for size in sizes:
            t = time.perf_counter()
            scale_load.fill(url, done + 1, size, args.events)
            scale_load.expired_reservations(url, 600, str(size))
            done = size
            load_s = time.perf_counter() - t
            print(f"filled to {size:,} runs / {size * args.events:,} events in {load_s:.0f} s;"
                  f" load average {os.getloadavg()[0]:.1f}", flush=True)
            for what, unit, value in rows(env, long_run):
                table.setdefault(what, []).append(value)
                units[what] = unit
        head = "".join(f"{f'{s:,} runs':>14}" for s in sizes)
        print(f"\n{'what':46}{'unit':>9}{head}{'last/first':>12}")
        for what, values in table.items():
            cells = "".join(f"{v:14.2f}" for v in values)
            print(f"{what:46}{units[what]:>9}{cells}{values[-1] / values[0]:12.2f}")


if __name__ == "__main__":
    main()
