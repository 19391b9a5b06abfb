"""How cost grows: the admission and capacity figures and every periodic job's time per
batch, with 10k, 100k and 1M ended runs (10 ledger events each) in the database, for
random ids (uuid4, the baseline) and time-ordered ids (UUIDv7, models/ids.py) side by side.

    python bench/bench_scale.py [--sizes 10000,100000,1000000] [--events 10]
                                [--ids random,ordered]

For each kind of id a fresh database is created, migrated (Alembic) and filled in SQL
(bench/scale_load.py): ended runs with attempts, leases, sandboxes, outbox rows and
events; an outbox backlog of 100,000 unsent rows (half due now, half deferred to
tomorrow); one run with 100,000 events; at each size, 3,000 more runs that ended 40 days
ago for retention to delete. The ids the fill writes, and those new runs get, are of
that kind. The `admit 100 runs` rows count what the same inserts as an admission (run,
outbox row, attempt, three events) touch, by EXPLAIN (ANALYZE, BUFFERS, WAL): unlike
times, they do not move with the machine's load. Each figure is the median over several
batches; `last/first` is the largest size's figure over the smallest's (flat is about 1).
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
PRUNE_BATCH = 500
PRUNABLE = PRUNE_BATCH * 6  # a warm-up batch and five measured


def median_of(sample: Callable[[], float], n: int) -> float:
    return statistics.median(sample() for _ in range(n))


def timed(fn: Callable[[], object], per: int = 1) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000 / per


def rows(env: dict[str, str], long_run: str, gc_runs: list[str]
         ) -> list[tuple[str, str, float]]:
    import tasks
    from models import new_id, new_task_id
    from tasks.acquisition import capacity
    from tasks.acquisition.claim import Claimed, claim
    from tasks.acquisition.startrate import RateRule, StartRateLimiter
    from tasks.admission.relay import publish_due, resend_stale
    from tasks.constants import LABEL_GENERATION, LABEL_RUN, QUEUE
    from tasks.maintenance.gc import verdict
    from tasks.maintenance.reaper import expire_reservations, reap
    from tasks.maintenance.retention import prune
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

    refs = [SandboxRef("fake", f"sb-{i}", {LABEL_RUN: run, LABEL_GENERATION: "1"}, 0.0)
            for i, run in enumerate(gc_runs, 1)]

    def gc() -> float:
        return timed(lambda: [verdict(ref) for ref in refs])

    def reaper_pass() -> float:
        ms = timed(lambda: reap(settings))
        broker.delete(QUEUE)
        return ms

    def expire() -> float:
        return timed(lambda: expire_reservations(200))

    def retention() -> float:
        return timed(lambda: prune(30 * 86400.0, batch=PRUNE_BATCH, max_batches=1))

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
        (f"retention: {PRUNE_BATCH} ended runs, all they left", "ms/batch", retention, 5),
    ]
    out = []
    for what, unit, sample, reps in measured:
        sample()  # warm
        out.append((what, unit, median_of(sample, reps)))
    pages = [scale_load.admission_pages(env["PLAYRUN_DATABASE_URL"],
                                        [new_id() for _ in range(100)],
                                        [new_task_id() for _ in range(100)])
             for _ in range(5)]
    for key, what, unit in (("dirtied", "pages dirtied", "pages"),
                            ("read", "pages read", "pages"), ("wal_kb", "WAL", "kB")):
        out.append((f"admit 100 runs (SQL, rolled back): {what}", unit,
                    statistics.median(p[key] for p in pages)))
    limiter.close()
    broker.close()
    return out


def measure(kinds: list[str], sizes: list[int], events: int, backlog: int
            ) -> tuple[dict[str, dict[str, list[float]]], dict[str, str]]:
    """Every row at every size for each kind of id (`random`, `ordered`), each kind in a
    database of its own; at each size the kinds are filled and measured in turns."""
    import uuid
    from contextlib import ExitStack

    from models import ids as model_ids
    from tasks.settings import reset_settings

    table: dict[str, dict[str, list[float]]] = {kind: {} for kind in kinds}
    units: dict[str, str] = {}
    with ExitStack() as stack:
        envs = {kind: stack.enter_context(bench_env(redis_db=12)) for kind in kinds}
        kind_ids = {kind: scale_load.ids(kind == "ordered") for kind in kinds}
        long_runs = {}
        for kind, env in envs.items():
            url = env["PLAYRUN_DATABASE_URL"]
            scale_load.bundle(url)
            scale_load.backlog(url, backlog // 2, backlog - backlog // 2, kind_ids[kind])
            long_runs[kind] = scale_load.long_ledger(url, 100_000)
        done = 0
        for size in sizes:
            for kind, env in envs.items():
                ids, url = kind_ids[kind], env["PLAYRUN_DATABASE_URL"]
                os.environ.update(env)  # what tasks.* reads: this kind's database and Redis
                reset_settings()
                model_ids.source = model_ids.uuid7 if ids.ordered else uuid.uuid4
                t = time.perf_counter()
                scale_load.fill(url, 1, PRUNABLE, events, ids, tag=f"p{size}", days=40,
                                vacuum=False)
                scale_load.fill(url, done + 1, size, events, ids)
                scale_load.expired_reservations(url, 600, str(size), ids)
                print(f"{kind} ids: filled to {size:,} runs / {size * events:,} events in "
                      f"{time.perf_counter() - t:.0f} s; load average "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
                for what, unit, value in rows(env, long_runs[kind],
                                              scale_load.run_ids(url, ids, 200)):
                    table[kind].setdefault(what, []).append(value)
                    units[what] = unit
                    print(f"  {kind:8}{size:>10,}  {what:46}{unit:>9}{value:10.2f}", flush=True)
            done = size
    model_ids.source = model_ids.uuid7
    return table, units


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--events", type=int, default=10)
    ap.add_argument("--backlog", type=int, default=100_000)
    ap.add_argument("--ids", default="random,ordered",
                    help="kinds of id to compare: random (uuid4), ordered (UUIDv7)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = [k for k in args.ids.split(",") if k]
    if not kinds or set(kinds) - {"random", "ordered"}:
        raise SystemExit("--ids takes random, ordered or both")
    started = time.perf_counter()
    results, units = measure(kinds, sizes, args.events, args.backlog)
    head = "".join(f"{f'{k[:3]} {s:,}':>14}" for k in kinds for s in sizes)
    print(f"\n{'what':46}{'unit':>9}{head}" + "".join(f"{k[:3] + ' last/first':>17}"
                                                     for k in kinds))
    for what in results[kinds[0]]:
        values = {k: results[k][what] for k in kinds}
        cells = "".join(f"{v:14.2f}" for k in kinds for v in values[k])
        ratios = "".join(f"{values[k][-1] / values[k][0]:17.2f}" if values[k][0] else
                         f"{'-':>17}" for k in kinds)
        print(f"{what:46}{units[what]:>9}{cells}{ratios}")
    print(f"\nsizes {args.sizes}, {args.events} events a run, ids {args.ids}: "
          f"{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
