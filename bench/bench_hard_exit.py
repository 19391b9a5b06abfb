"""Hard exits: time from a runner's hard exit to its run's terminal, with the sandbox's
exit report and without it (PLAYRUN_EXIT_REPORT=false: the heartbeat timeout alone).

    python bench/bench_hard_exit.py [-n 10] [--rounds 1] [--isolation process]
                                    [--heartbeat-timeout-s 30]
                                    [--provider local|daytona|e2b|modal|agentcore]

--provider other than local: the provider's real SDK in the worker against its loopback
double (tests/doubles/), whose sandboxes' processes run on this host, so the marker works
there too; the report comes from the boot script (playrun_boot.py).

About 1 minute per round with the defaults (the side without the report waits out the
heartbeat timeout, its first lease and a reaper pass).

The stack is real: a `playrun gateway`, one `celery -A tasks worker --concurrency=2 --beat`
started afresh for each side with PLAYRUN_EXIT_REPORT on or off, the local sandbox provider
(a supervisor and a runner process per run) or a double, PostgreSQL and Redis; the
heartbeat timeout and the reaper's interval are the defaults (30 s, 5 s), the start rate is
opened up. Each round
submits N runs of bench/plays/hard_exit.py at once on each side, in turns: the play writes
the time to a file on the host, then calls os._exit(0), so its run must fail
RUNTIME_RUNNER_LOST. Measured per run, by the host's clock (the database runs on the same
host): exit -> terminal (the marker's time to runs.finished_at; not in strict isolation, a
strict sandbox cannot write to the host) and sandbox live -> terminal (ledger events, any
isolation). Printed: p50 and max of each side, and the ratio of the p50s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    bench_env,
    gateway_env,
    pct,
    start_gateway,
    start_worker,
    stop_on_sigterm,
)

PLAY = ROOT / "bench" / "plays" / "hard_exit.py"
SIDES = (("with the exit report", "true"), ("heartbeat timeout only", "false"))


def one_side(env: dict[str, str], log_dir: Path, name: str, report: str, n: int,
             markers: Path | None, wait_s: float) -> tuple[list[float], list[float]]:
    """(exit -> terminal, sandbox live -> terminal) of N runs, seconds."""
    import tasks
    from tasks.acquisition import capacity

    org = f"hx-{uuid.uuid4().hex[:6]}"
    capacity.set_limit(org, n + 5)
    worker = start_worker({**env, "PLAYRUN_EXIT_REPORT": report}, log_dir, name,
                          concurrency=2, beat=True)
    try:
        files = [markers / f"{org}-{i}" for i in range(n)] if markers else [None] * n
        handles = [tasks.submit_run(PLAY, input={"marker": str(f) if f else None},
                                    org_id=org) for f in files]
        for handle in handles:
            result = handle.wait(timeout=wait_s)
            if result.code != "RUNTIME_RUNNER_LOST":
                raise RuntimeError(f"run {handle.id} ended {result.status} {result.code}")
    finally:
        worker.stop()
    with psycopg.connect(env["PLAYRUN_DATABASE_URL"].replace("+psycopg", "")) as conn:
        rows = conn.execute(
            "SELECT r.id, extract(epoch FROM r.finished_at), extract(epoch FROM "
            "r.finished_at - (SELECT min(e.at) FROM run_events e WHERE e.run_id = r.id "
            "AND e.kind = 'sandbox.live')) FROM runs r WHERE r.id = ANY(%s)",
            ([h.id for h in handles],)).fetchall()
    finished = {run_id: float(at) for run_id, at, _ in rows}
    from_live = [float(s) for _, _, s in rows]
    from_exit = [finished[h.id] - float(f.read_text()) for h, f in zip(handles, files,
                                                                       strict=True) if f]
    return from_exit, from_live


@contextmanager
def double_for(provider: str, log_dir: Path) -> Iterator[Any]:
    """The provider's loopback double, running; None for local."""
    if provider == "local":
        yield None
        return
    from tests.doubles.base import discover

    with discover()[provider](log_dir / "double") as double:
        yield double


def line(label: str, values: list[float]) -> str:
    if not values:
        return f"    {label:<22} -"
    return f"    {label:<22} p50 {pct(values, 50):7.2f} s   max {max(values):7.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10, help="runs per side and round")
    parser.add_argument("--rounds", type=int, default=1, help="turns of both sides")
    parser.add_argument("--isolation", choices=("process", "strict"), default="process")
    parser.add_argument("--heartbeat-timeout-s", type=float, default=30.0)
    parser.add_argument("--provider", default="local",
                        choices=("local", "daytona", "e2b", "modal", "agentcore"))
    args = parser.parse_args()
    stop_on_sigterm()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-hard-exit-"))
    markers = None
    if args.isolation == "process" or args.provider != "local":
        markers = log_dir / "markers"
        markers.mkdir(mode=0o777)
    results: dict[str, tuple[list[float], list[float]]] = {s: ([], []) for s, _ in SIDES}
    failed = True
    with bench_env(redis_db=14) as env, double_for(args.provider, log_dir) as double:
        env.update(gateway_env(log_dir))
        if double is not None:
            env.update({**double.env, "PLAYRUN_GATEWAY_PUBLIC_URL": env["PLAYRUN_GATEWAY_URL"]})
        env.update({
            "PLAYRUN_SANDBOX_PROVIDER": args.provider,
            "PLAYRUN_SANDBOX_ISOLATION": args.isolation,
            "PLAYRUN_HEARTBEAT_TIMEOUT_S": f"{args.heartbeat_timeout_s:g}",
            # Pacing is not what is measured here (the default is 60 starts/min).
            "PLAYRUN_START_RATE_INITIAL_PER_MIN": "6000",
            "PLAYRUN_START_RATE_MAX_PER_MIN": "12000",
        })
        env = {**os.environ, **env}
        gateway = start_gateway(env, log_dir)
        try:
            wait_s = 2 * args.heartbeat_timeout_s + 120
            for i in range(args.rounds):
                for label, report in SIDES:
                    exits, lives = one_side(env, log_dir, f"w{i}{report[0]}", report, args.n,
                                            markers, wait_s)
                    results[label][0].extend(exits)
                    results[label][1].extend(lives)
            failed = False
        finally:
            gateway.stop()
            if failed:
                print(f"logs kept in {log_dir}", file=sys.stderr)
    if not failed:
        shutil.rmtree(log_dir, ignore_errors=True)
    print_report(args, results)


def print_report(args: argparse.Namespace, results: dict[str, Any]) -> None:
    where = (f"local sandboxes, {args.isolation} isolation" if args.provider == "local"
             else f"{args.provider} double")
    print(f"hard exit (os._exit(0)) -> terminal, {args.n} runs x {args.rounds} round(s) a "
          f"side, {where}, heartbeat timeout {args.heartbeat_timeout_s:g} s")
    for label, (exits, lives) in results.items():
        print(f"  {label}")
        print(line("exit -> terminal", exits))
        print(line("live -> terminal", lives))
    (on_exit, on_live), (off_exit, off_live) = results.values()
    key = (on_exit, off_exit) if on_exit and off_exit else (on_live, off_live)
    print(f"  ratio of p50s (report / heartbeat timeout): "
          f"{pct(key[0], 50) / pct(key[1], 50):.4f}")


if __name__ == "__main__":
    main()
