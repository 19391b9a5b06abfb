"""Warm pools against cold starts, side by side in one run: submit -> play started, claims
per second from one pool, and provider creates per served run.

    python bench/bench_pools.py [-n 40] [--provider local|daytona|e2b|modal|agentcore]

A real gateway and a worker (with beat) on PostgreSQL and Redis. Cold: no pool, each run
creates its sandbox. Warm: `pool set default --min 4 --max 8`, runs one at a time, each
taking a ready sandbox. The play returns time.time() as it starts, against the submitting
process's clock (one host). Claims/s: a burst of runs submitted together against a pool
holding one ready sandbox each, from the burst's submit to its last `pool.claimed`, with
4 worker processes. Creates per served run: runs every --every seconds for --soak-s against
a pool with a short --ttl, counting every sandbox the provider made (members and cold).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.bench_hard_exit import double_for  # noqa: E402
from bench.common import (  # noqa: E402
    bench_env,
    gateway_env,
    pct,
    start_gateway,
    start_worker,
    stop_on_sigterm,
)

PLAY = ROOT / "bench" / "plays" / "clock.py"


def until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            from tasks.acquisition.pools import view
            raise TimeoutError(f"{what}: pools now {view.states()}")
        time.sleep(0.02)


def ready() -> int:
    from tasks.acquisition.pools import view

    return view.states().get("default", {}).get("ready", 0)


# Where a warm start's time goes: the queue (submit -> the worker opened the attempt),
# the claim (-> pool.claimed, by the database clock), the hand-over (-> the play began).
STAGES: dict[str, list[float]] = {"queue": [], "claim": [], "hand-over": []}


def _stages(run_id: str, t0: float, play_at: float) -> None:
    import tasks

    at = {e.kind: e.at.timestamp() for e in tasks.run_events(run_id)}
    if "pool.claimed" in at:
        STAGES["queue"].append(at["attempt.started"] - t0)
        STAGES["claim"].append(at["pool.claimed"] - at["attempt.started"])
        STAGES["hand-over"].append(play_at - at["pool.claimed"])


def one_at_a_time(n: int, org: str, warm: bool) -> tuple[list[float], int]:
    """Seconds from submit to the play's start, and how many runs took a warm sandbox."""
    import tasks

    out, hits = [], 0
    for i in range(n):
        if warm:
            until(lambda: ready() >= 1, 60, "a ready sandbox")
        t0 = time.time()
        handle = tasks.submit_run(PLAY, input={"i": i}, org_id=org)
        result = handle.wait(timeout=120)
        assert result.status == "succeeded", result
        out.append(float(result.output["at"]) - t0)
        hits += any(e.kind == "pool.claimed" for e in tasks.run_events(handle.id))
        if warm:
            _stages(handle.id, t0, float(result.output["at"]))
    return out, hits


def claims_per_s(burst: int) -> tuple[float, int]:
    """A burst of runs against a pool holding one ready sandbox each."""
    import sqlalchemy as sa

    import tasks
    from models import RunEvent
    from tasks.store.db import session_scope

    until(lambda: ready() >= burst, 180, f"{burst} ready sandboxes")
    with session_scope(readonly=True) as session:
        t0 = session.scalar(sa.select(sa.func.clock_timestamp()))
    handles = tasks.submit_runs([{"play": str(PLAY), "input": {"b": i}, "org_id": "burst"}
                                 for i in range(burst)])
    for handle in handles:
        assert handle.wait(timeout=120).status == "succeeded"
    with session_scope(readonly=True) as session:
        claimed = session.execute(sa.select(sa.func.count(), sa.func.max(RunEvent.at)).where(
            RunEvent.run_id.in_([h.id for h in handles]),
            RunEvent.kind == "pool.claimed")).one()
    assert claimed[1] is not None and t0 is not None
    return claimed[0] / (claimed[1] - t0).total_seconds(), int(claimed[0])


def soak(seconds: float, every: float) -> tuple[int, int]:
    """(runs served, sandboxes the provider made) while runs come every `every` s."""
    import sqlalchemy as sa

    import tasks
    from models import PoolMember, RunEvent
    from tasks.store.db import session_scope

    with session_scope(readonly=True) as session:
        t0 = session.scalar(sa.select(sa.func.clock_timestamp()))
    handles = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        handles.append(tasks.submit_run(PLAY, input={}, org_id="soak"))
        time.sleep(every)
    for handle in handles:
        assert handle.wait(timeout=120).status == "succeeded"
    with session_scope(readonly=True) as session:
        members = session.scalar(sa.select(sa.func.count()).select_from(PoolMember).where(
            PoolMember.created_at >= t0)) or 0
        cold = session.scalar(sa.select(sa.func.count()).select_from(RunEvent).where(
            RunEvent.run_id.in_([h.id for h in handles]),
            RunEvent.kind == "sandbox.requested")) or 0
    return len(handles), int(members) + int(cold)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=40)
    parser.add_argument("--provider", default="local",
                        choices=("local", "daytona", "e2b", "modal", "agentcore"))
    parser.add_argument("--burst", type=int, default=24)
    parser.add_argument("--soak-s", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--ttl", default="15s")
    args = parser.parse_args()
    stop_on_sigterm()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-pools-"))
    children: list[Any] = []
    failed = True
    with bench_env(redis_db=13) as env, double_for(args.provider, log_dir) as double:
        env.update(gateway_env(log_dir))
        if double is not None:
            env.update({**double.env, "PLAYRUN_GATEWAY_PUBLIC_URL": env["PLAYRUN_GATEWAY_URL"]})
        env.update({"PLAYRUN_SANDBOX_PROVIDER": args.provider,
                    "PLAYRUN_START_RATE_INITIAL_PER_MIN": "6000",
                    "PLAYRUN_START_RATE_MAX_PER_MIN": "12000",
                    "PLAYRUN_ORG_CAPACITY": "100"})
        env = {**os.environ, **env}
        os.environ.update(env)
        from tasks.acquisition.pools import config
        from tasks.settings import reset_settings

        reset_settings()
        try:
            children.append(start_gateway(env, log_dir))
            worker = start_worker(env, log_dir, "pools", beat=True)
            children.append(worker)
            one_at_a_time(3, "warm-up", warm=False)
            cold, _ = one_at_a_time(args.n, "cold", warm=False)
            config.set_pool(config.build("default", 4, 8, "10m", args.provider))
            until(lambda: ready() >= 4, 120, "four ready sandboxes")
            warm, hits = one_at_a_time(args.n, "warm", warm=True)
            worker.stop()
            children.remove(worker)
            children.append(start_worker(env, log_dir, "pools4", concurrency=4, beat=True))
            config.set_pool(config.build("default", args.burst, args.burst, "10m",
                                         args.provider))
            rate, claimed = claims_per_s(args.burst)
            config.set_pool(config.build("default", 2, 4, args.ttl, args.provider))
            served, made = soak(args.soak_s, args.every)
            failed = False
        finally:
            for child in reversed(children):
                with contextlib.suppress(Exception):
                    child.stop()
            if failed:
                print(f"logs kept in {log_dir}", file=sys.stderr)
    shutil.rmtree(log_dir, ignore_errors=True)
    print(f"{args.provider}: submit -> play started, {args.n} runs one at a time each side")
    for label, values in (("cold (no pool)", cold), (f"warm ({hits}/{args.n} hits)", warm)):
        print(f"  {label:<22} p50 {pct(values, 50) * 1000:7.1f} ms   "
              f"p99 {pct(values, 99) * 1000:7.1f} ms")
    print(f"  warm / cold            p50 {pct(warm, 50) / pct(cold, 50):7.2f}x    "
          f"p99 {pct(warm, 99) / pct(cold, 99):7.2f}x")
    for stage, values in STAGES.items():
        if values:
            print(f"    warm {stage:<17} p50 {pct(values, 50) * 1000:7.1f} ms   "
                  f"p99 {pct(values, 99) * 1000:7.1f} ms")
    print(f"  claims from one pool, 4 worker processes: {rate:.0f}/s ({claimed} of "
          f"{args.burst} claimed warm)")
    print(f"  creates per served run, a run every {args.every:g} s for {args.soak_s:g} s, "
          f"pool min 2 ttl {args.ttl}: {made / served:.2f} (without a pool: 1.00)")


if __name__ == "__main__":
    main()
