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
--long M: then M more playrun runs, and the worker trees' RSS after 100 and after M+100.
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
    gateway_env,
    start_gateway,
    start_worker,
    stop_on_sigterm,
    tree_rss,
)

NOOP = ROOT / "examples" / "plays" / "noop.py"


def plain(n: int, env: dict[str, str], log_dir: Path) -> float:
    workers = []
    try:
        for i in range(2):
            args = [sys.executable, "-m", "celery", "-A", "bench.plain_app", "worker",
                    "-n", f"plain{i}@bench", "--concurrency=2", "--loglevel=INFO",
                    "--without-mingle", "--without-gossip", "-Q", "bench.plain"]
            workers.append(Child(f"plain{i}", args, env, log_dir))
        for w in workers:
            w.wait_for("ready.", timeout=90)
        from bench.plain_app import count

        counter = redis.Redis.from_url(env["PLAYRUN_REDIS_URL"])
        warm = f"warm-{uuid.uuid4().hex}"
        for _ in range(20):
            count.delay(warm)
        wait_count(counter, warm, 20)
        key = f"count-{uuid.uuid4().hex}"
        t0 = time.perf_counter()
        for _ in range(n):
            count.delay(key)
        wait_count(counter, key, n)
        return n / (time.perf_counter() - t0)
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
    from tasks.db import session_scope

    t0 = time.time()
    with ThreadPoolExecutor(4) as pool:
        handles = list(pool.map(
            lambda i: tasks.submit_run(NOOP, input={"fake": {"seconds": 0}, "i": i},
                                       org_id=org), range(n)))
    ids = [h.id for h in handles]
    deadline = time.monotonic() + 900
    while True:
        with session_scope(readonly=True) as session:
            done = session.scalar(sa.select(sa.func.count()).where(
                Run.id.in_(ids), Run.finished_at.is_not(None)))
            if done == n:
                last = session.scalar(sa.select(sa.func.max(Run.finished_at))
                                      .where(Run.id.in_(ids)))
                bad = session.scalar(sa.select(sa.func.count()).where(
                    Run.id.in_(ids), Run.status != "succeeded"))
                break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{done} of {n} finished")
        time.sleep(0.2)
    if bad:
        raise RuntimeError(f"{bad} of {n} runs did not succeed")
    return n / (last.timestamp() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=300)
    parser.add_argument("--long", type=int, default=0, help="runs for the memory figure")
    args = parser.parse_args()
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
        plain_rate = plain(args.n, env, log_dir)
        procs = [start_gateway(env, log_dir)]
        try:
            host = Child("runner-host", [sys.executable, "-m", "tasks.sandbox.fake_runners",
                                         str(root)], env, log_dir)
            procs.append(host)
            host.wait_for("ready")
            workers = [start_worker(env, log_dir, f"tp{i}", concurrency=2, beat=i == 0)
                       for i in range(2)]
            procs += workers
            submit_and_wait(20, org)  # warm: imports, pools, connections
            rate = submit_and_wait(args.n, org)
            rss = []
            if args.long:
                submit_and_wait(100 - 20, org)
                rss.append(sum(tree_rss(w.pid) for w in workers))
                done = 0
                while done < args.long:
                    batch = min(1000, args.long - done)
                    submit_and_wait(batch, org)
                    done += batch
                rss.append(sum(tree_rss(w.pid) for w in workers))
        finally:
            for p in reversed(procs):
                p.stop()
    print(f"{args.n} no-op runs, 2 workers x --concurrency=2, fake provider (hosted runners)")
    print(f"{'plain Celery count.delay(), end to end':44} {plain_rate:8.1f} /s   1.00")
    print(f"{'playrun submit_run -> terminal':44} {rate:8.1f} /s   {rate / plain_rate:.3f}")
    if rss:
        print(f"worker trees' RSS after 100 runs {rss[0] / 2**20:.0f} MB, after {args.long + 100}"
              f" runs {rss[1] / 2**20:.0f} MB: ratio {rss[1] / rss[0]:.3f}")


if __name__ == "__main__":
    main()
