"""Fair order of starts against FIFO, side by side in one run.

    python bench/bench_fair.py [--runs 600] [--rate 3000] [--backlog 10000]
                               [--trials 3] [--memory-backlog 100000]

Real workers (2 x --concurrency=2, beat in the first), PostgreSQL and Redis, the `fake`
provider with hosted runners and no runner host: a started run holds its sandbox, so the
figures are about starts alone. For each order, PLAYRUN_START_ORDER is set for the
workers and for this process (which submits, and so relays in fair order).

(1) Total starts/s, same load: --runs runs of three orgs at a fixed rate of --rate/min,
    from the first start to the last (sandbox.requested events); fair / fifo.
(2) Time to first start of a newly active org behind a --backlog run backlog of one org
    at 600/min: --trials newcomers, each from its submit to its first start. FIFO's wait is
    the backlog ahead of it: a trial that passes 60 s is cut off and shown as ">60".
(3) Redis memory and the start queue's length after --memory-backlog runs are admitted
    with no worker running (INFO used_memory before and after; LLEN playrun).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import bench_env, pct, start_worker
from tasks.store import redisconn

ROOT = Path(__file__).resolve().parent.parent
NOOP = str(ROOT / "examples" / "plays" / "noop.py")
ORDERS = ("fair", "fifo")


def fixed(per_min: int) -> dict[str, str]:
    rate = str(per_min)
    return {"PLAYRUN_SANDBOX_PROVIDER": "fake", "PLAYRUN_START_RATE_INITIAL_PER_MIN": rate,
            "PLAYRUN_START_RATE_MAX_PER_MIN": rate, "PLAYRUN_START_RATE_FLOOR_PER_MIN": rate,
            "PLAYRUN_ORG_CAPACITY": "1000000", "PLAYRUN_HEARTBEAT_TIMEOUT_S": "3600",
            "PLAYRUN_RUN_TIMEOUT_S": "3600", "PLAYRUN_SWEEP_INTERVAL_S": "1",
            "PLAYRUN_METRICS_ENABLED": "false", "PLAYRUN_DEFERRAL_MAX_COUNT": "1000",
            "PLAYRUN_DEFERRAL_MAX_TOTAL_S": "36000"}


def use(env: dict[str, str], order: str, per_min: int) -> dict[str, str]:
    from tasks.settings import reset_settings

    out = {**env, **fixed(per_min), "PLAYRUN_START_ORDER": order}
    os.environ.update(out)
    reset_settings()
    return out


def clean(env: dict[str, str]) -> None:
    """Queued runs cancelled, the outbox and Redis emptied: the next phase starts bare."""
    from tasks.store.db import session_scope

    with session_scope() as s:
        s.execute(sa.text("UPDATE runs SET status = 'cancelled' WHERE status NOT IN "
                          "('succeeded', 'failed', 'cancelled')"))
        s.execute(sa.text("DELETE FROM outbox"))
        s.execute(sa.text("UPDATE capacity_leases SET state = 'released' "
                          "WHERE state IN ('reserved', 'live')"))
        s.execute(sa.text("UPDATE attempts SET state = 'ended' WHERE state IN "
                          "('active', 'deferred')"))
    client = redisconn.client(env["PLAYRUN_REDIS_URL"])
    for key in client.scan_iter(match="*"):
        if not key.startswith(b"playrun:bench-session"):
            client.delete(key)


def starts(orgs: list[str]) -> list[tuple[str, float]]:
    from tasks.store.db import session_scope

    with session_scope(readonly=True) as s:
        rows = s.execute(sa.text(
            "SELECT r.org_id, e.at FROM run_events e JOIN runs r ON r.id = e.run_id "
            "WHERE e.kind = 'sandbox.requested' AND r.org_id = ANY(:orgs) ORDER BY e.id"),
            {"orgs": orgs}).all()
    return [(o, t.timestamp()) for o, t in rows]


def submit(org: str, n: int) -> None:
    import tasks

    for start in range(0, n, 5000):
        tasks.submit_runs([{"play": NOOP, "org_id": org} for _ in range(min(5000, n - start))])


def wait(check, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def fleet(env: dict[str, str], logs: Path, tag: str) -> list:  # type: ignore[type-arg]
    return [start_worker(env, logs, f"{tag}{i}", concurrency=2, beat=i == 0) for i in range(2)]


def throughput(base: dict[str, str], order: str, runs: int, rate: int, logs: Path) -> float:
    env = use(base, order, rate)
    workers = fleet(env, logs, f"tp-{order}-")
    try:
        orgs = [f"tp-{order}-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
        import tasks

        tasks.submit_runs([{"play": NOOP, "org_id": o} for _ in range(runs // 3) for o in orgs])
        wait(lambda: len(starts(orgs)) >= 3 * (runs // 3), timeout=600)
        times = [t for _, t in starts(orgs)]
        return (len(times) - 1) / max(times[-1] - times[0], 1e-9)
    finally:
        for w in workers:
            w.stop()
        clean(base)


def first_start(base: dict[str, str], order: str, backlog: int, trials: int,
                logs: Path) -> list[float | None]:
    env = use(base, order, 600)
    big = f"big-{order}-{uuid.uuid4().hex[:6]}"
    submit(big, backlog)
    workers = fleet(env, logs, f"fs-{order}-")
    out: list[float | None] = []
    try:
        wait(lambda: len(starts([big])) >= 5, timeout=120)
        for _ in range(trials):
            newcomer = f"new-{order}-{uuid.uuid4().hex[:6]}"
            t0 = time.time()
            submit(newcomer, 1)
            if wait(lambda newcomer=newcomer: starts([newcomer]), timeout=60):
                out.append(starts([newcomer])[0][1] - t0)
            else:
                out.append(None)
            time.sleep(1)  # the next newcomer is new again: its org's first start
    finally:
        for w in workers:
            w.stop()
        clean(base)
    return out


def memory(base: dict[str, str], order: str, backlog: int) -> tuple[int, int]:
    from tasks.constants import QUEUE

    use(base, order, 600)
    client = redisconn.client(base["PLAYRUN_REDIS_URL"])
    before = int(client.info("memory")["used_memory"])
    submit(f"mem-{order}-{uuid.uuid4().hex[:6]}", backlog)
    after = int(client.info("memory")["used_memory"])
    length = int(client.llen(QUEUE))
    clean(base)
    return after - before, length


def show(values: list[float | None]) -> str:
    done = [v for v in values if v is not None]
    cut = len(values) - len(done)
    if not done:
        return f">60 s in all {cut}"
    text = f"p50 {pct(done, 50):.2f} s, max {max(done):.2f} s"
    return text + (f" (+{cut} cut off at 60 s)" if cut else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=600)
    ap.add_argument("--rate", type=int, default=3000)
    ap.add_argument("--backlog", type=int, default=10_000)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--memory-backlog", type=int, default=100_000)
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="playrun-bench-fair-"))
    with bench_env(14) as base:
        from tasks.sandbox import FakeScript

        root = Path(base["PLAYRUN_SANDBOX_ROOT"])
        root.mkdir(parents=True, exist_ok=True)
        FakeScript(root).set(hosted_runners=True)
        rates = {o: throughput(base, o, args.runs, args.rate, logs) for o in ORDERS}
        print(f"(1) {args.runs} runs of 3 orgs at {args.rate}/min, 2 workers x 2")
        for o in ORDERS:
            print(f"    {o}: {rates[o]:.1f} starts/s")
        print(f"    fair / fifo: {rates['fair'] / rates['fifo']:.3f}")
        waits = {o: first_start(base, o, args.backlog, args.trials, logs) for o in ORDERS}
        print(f"(2) a newcomer's first start behind {args.backlog} queued runs, 600/min")
        for o in ORDERS:
            print(f"    {o}: {show(waits[o])}")
        mem = {o: memory(base, o, args.memory_backlog) for o in ORDERS}
        print(f"(3) {args.memory_backlog} runs admitted, no worker")
        for o in ORDERS:
            print(f"    {o}: Redis {mem[o][0] / 2**20:+.1f} MiB, start queue {mem[o][1]}")
        print(f"    fair / fifo memory: {max(mem['fair'][0], 0) / max(mem['fifo'][0], 1):.4f}")


if __name__ == "__main__":
    main()
