"""Sustained no-op runs per second through playrun against plain Celery no-op tasks end to
end, on the same two workers' worth of processes; and a worker's memory as runs add up.

    python bench/bench_throughput.py [-n 300] [--long 0]

playrun: a `playrun gateway`, two `celery -A tasks worker --concurrency=2` (one with
--beat), the `fake` provider with hosted runners (one runner host process speaks the real
protocol for every sandbox), PostgreSQL and Redis; N no-op runs submitted by 4 app threads,
timed from the first submit to the last terminal (database clock).
plain Celery: two `celery -A bench.plain_app worker --concurrency=2` on the same Redis; N
`count.delay()` (a task that INCRs a Redis key), timed from the first publish until the
counter reads N.
--long N: also the workers' RSS after 100 runs and after N runs (counting the warm-up and
the N throughput runs), for their main processes and their pool children, sum and max
(beat then runs as its own process, so a worker's descendants are its pool children).
A line per 1,000 runs goes to stderr, to tell a steady growth from a step.
Also printed: the CPU each process kind spent per run over the timed runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    Child,
    bench_env,
    cpu_matching,
    database_name,
    gateway_env,
    rss,
    start_beat,
    start_child,
    start_gateway,
    start_worker,
    stop_on_sigterm,
    tree_cpu,
    tree_pids,
)
from tasks.store import redisconn  # noqa: E402

NOOP = ROOT / "examples" / "plays" / "noop.py"


def plain(n: int, env: dict[str, str], log_dir: Path) -> tuple[float, float]:
    """Tasks per second, and CPU ms per task (workers and this process)."""
    workers = []
    try:
        for i in range(2):
            args = [sys.executable, "-m", "celery", "-A", "bench.plain_app", "worker",
                    "-n", f"plain{i}@bench", "--concurrency=2", "--loglevel=INFO",
                    "--without-mingle", "--without-gossip", "-Q", "bench.plain"]
            workers.append(start_child(f"plain{i}", args, env, log_dir))
        for w in workers:
            w.wait_for("ready.", timeout=90)
        from bench.plain_app import count

        counter = redisconn.client(env["PLAYRUN_REDIS_URL"])
        warm = f"warm-{uuid.uuid4().hex}"
        for _ in range(20):
            count.delay(warm)
        wait_count(counter, warm, 20)
        key = f"count-{uuid.uuid4().hex}"
        cpu0 = sum(tree_cpu(w.pid) for w in workers) + sum(os.times()[:2])
        t0 = time.perf_counter()
        for _ in range(n):
            count.delay(key)
        wait_count(counter, key, n)
        rate = n / (time.perf_counter() - t0)
        cpu = sum(tree_cpu(w.pid) for w in workers) + sum(os.times()[:2]) - cpu0
        return rate, 1000 * cpu / n
    finally:
        for w in workers:
            w.stop()


def wait_count(counter: redis.Redis, key: str, n: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while int(counter.get(key) or 0) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {counter.get(key)} of {n} counted")
        time.sleep(0.01)


def submit_and_wait(n: int, org: str) -> float:
    """Runs per second, first submit to last terminal."""
    import sqlalchemy as sa

    import tasks
    from models import Run
    from tasks.store.db import session_scope

    with session_scope(readonly=True) as session:
        since = session.scalar(sa.select(sa.func.now()))
    t0 = time.time()
    with ThreadPoolExecutor(4) as pool:
        handles = list(pool.map(
            lambda i: tasks.submit_run(NOOP, input={"fake": {"seconds": 0}, "i": i},
                                       org_id=org), range(n)))
    ids = [h.id for h in handles]
    # The poll reads this call's runs by the (org, created_at) index: an IN list of every
    # id, five times a second, cost PostgreSQL and this process a third of a core.
    ours = (Run.org_id == org, Run.created_at >= since)
    deadline = time.monotonic() + 900
    while True:
        with session_scope(readonly=True) as session:
            done = session.scalar(sa.select(sa.func.count()).where(
                *ours, Run.finished_at.is_not(None)))
        if done == n:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{done} of {n} finished")
        time.sleep(0.2)
    with session_scope(readonly=True) as session:  # once: every id, exactly
        last, finished, bad = session.execute(sa.select(
            sa.func.max(Run.finished_at), sa.func.count(Run.finished_at),
            sa.func.count().filter(Run.status != "succeeded")).where(Run.id.in_(ids))).one()
    if finished != n or bad:
        raise RuntimeError(f"{finished} of {n} runs finished, {bad} did not succeed")
    return n / (last.timestamp() - t0)


def worker_rss(workers: list[Child]) -> dict[str, list[int]]:
    """RSS in bytes of each worker's main process, and of each of their pool children."""
    return {"main": [rss(w.pid) for w in workers],
            "children": [rss(p) for w in workers for p in tree_pids(w.pid) if p != w.pid]}


def rss_table(first: dict[str, list[int]], last: dict[str, list[int]], n: int) -> str:
    rows = [f"{'worker RSS, MB':34} {'after 100':>10} {f'after {n}':>12} {'ratio':>7}"]
    for label, key, f in [("main processes, sum", "main", sum),
                          ("main processes, max", "main", max),
                          ("pool children, sum", "children", sum),
                          ("pool children, max", "children", max)]:
        a, b = f(first[key]), f(last[key])
        rows.append(f"{label:34} {a / 2**20:10.1f} {b / 2**20:12.1f} {b / a:7.3f}")
    a = sum(first["main"]) + sum(first["children"])
    b = sum(last["main"]) + sum(last["children"])
    rows.append(f"{'worker trees, sum':34} {a / 2**20:10.1f} {b / 2**20:12.1f} {b / a:7.3f}")
    counts = f"{len(first['children'])} -> {len(last['children'])}"
    rows.append(f"(pool children: {counts}; a changed count means a child was replaced)")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=300)
    parser.add_argument("--long", type=int, default=0,
                        help="RSS after 100 runs and after this many in all")
    args = parser.parse_args()
    if args.long and args.long < 100 + args.n:
        parser.error(f"--long counts every run: it must be at least 100 + n = {100 + args.n}")
    stop_on_sigterm()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    with bench_env(redis_db=13) as env:
        from tasks.acquisition import capacity
        from tasks.sandbox import FakeScript

        root = Path(env["PLAYRUN_SANDBOX_ROOT"])
        FakeScript(root).set(hosted_runners=True)
        env.update(gateway_env(log_dir))
        env.update({"PLAYRUN_SANDBOX_PROVIDER": "fake",
                    "PLAYRUN_START_RATE_INITIAL_PER_MIN": "600000",
                    "PLAYRUN_START_RATE_MAX_PER_MIN": "600000"})
        env = {**os.environ, **env}
        org = f"bench-{uuid.uuid4().hex[:6]}"
        capacity.set_limit(org, 100_000)
        plain_rate, plain_cpu = plain(args.n, env, log_dir)
        procs = [start_gateway(env, log_dir)]
        try:
            host = start_child("runner-host", [sys.executable, "-m", "tasks.sandbox.fake_runners",
                                         str(root)], env, log_dir)
            procs.append(host)
            host.wait_for("ready")
            if args.long:  # beat on its own: the workers' trees are then their pools alone
                procs.append(start_beat(env, log_dir))
            workers = [start_worker(env, log_dir, f"tp{i}", concurrency=2,
                                    beat=i == 0 and not args.long) for i in range(2)]
            procs += workers
            submit_and_wait(20, org)  # warm: imports, pools, connections
            snapshots = []
            if args.long:
                submit_and_wait(100 - 20, org)
                snapshots.append(worker_rss(workers))
            sides = {"gateway": lambda: tree_cpu(procs[0].pid),
                     "worker trees (mains, pools, beat)":
                         lambda: sum(tree_cpu(w.pid) for w in workers),
                     "runner host": lambda: tree_cpu(host.pid),
                     "PostgreSQL backends": lambda: cpu_matching(database_name(env)),
                     "this process (4 submitting threads, poller)":
                         lambda: sum(os.times()[:2])}
            before = {k: f() for k, f in sides.items()}
            rate = submit_and_wait(args.n, org)
            cpu_ms = {k: 1000 * (f() - before[k]) / args.n for k, f in sides.items()}
            if args.long:
                done = 100 + args.n
                while done < args.long:
                    batch = min(1000 - done % 1000, args.long - done)
                    submit_and_wait(batch, org)
                    done += batch
                    now = worker_rss(workers)
                    print(f"{done:6} runs: main {sum(now['main']) / 2**20:6.1f} MB, children "
                          f"{sum(now['children']) / 2**20:6.1f} MB", file=sys.stderr, flush=True)
                snapshots.append(worker_rss(workers))
        finally:
            for p in reversed(procs):
                p.stop()
    print(f"{args.n} no-op runs, 2 workers x --concurrency=2, fake provider (hosted runners)")
    print(f"{'plain Celery count.delay(), end to end':44} {plain_rate:8.1f} /s   1.00")
    print(f"{'playrun submit_run -> terminal':44} {rate:8.1f} /s   {rate / plain_rate:.3f}")
    print("CPU per run (ms), by process, over the timed runs:")
    for label, ms in cpu_ms.items():
        print(f"  {label:42} {ms:7.1f}")
    print(f"  {'all of the above':42} {sum(cpu_ms.values()):7.1f}   (Redis not counted)")
    print(f"  {'plain Celery: workers and this process':42} {plain_cpu:7.1f}   per task")
    if args.long:
        print(rss_table(snapshots[0], snapshots[1], args.long))


if __name__ == "__main__":
    main()
