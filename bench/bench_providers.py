"""Cloud providers through playrun, against each provider's loopback double (the real SDK
in a real worker, the double speaking the provider's wire protocol; tests/doubles).

    python bench/bench_providers.py [--providers daytona,e2b,modal,agentcore] [-n 20]
                                    [--rate 60] [--duration 180] [--warmup 60] [--quick]
                                    [--only overhead|goodput]

(a) Start overhead: submit -> runner started, through playrun (a `playrun gateway` and a
    worker subprocess, PostgreSQL, Redis), side by side with the bare SDK's create +
    upload + exec of the same runner (bench/provider_bare.py) against the same double, N
    runs each, one at a time. "Runner started" is the boot script's start record
    (.playrun/started.json, written as the runner process starts): the play returns it
    (bench/plays/started_at.py); the bare path reads it back after its exec. Runs are
    spaced past the start-rate bucket's interval so pacing is not counted. Goal <= 1.2x.
(b) Goodput under pushback: the double refuses creates past R a minute (sliding window,
    429 with Retry-After). A closed loop keeps --backlog runs queued for --duration s;
    after --warmup s, the creates the double accepted a minute (goal >= 0.8 R) and its
    429s as a share of them (goal <= 10%). --quick: 60 s after a 30 s warm-up.
BENCH_KEEP_LOGS=1 keeps the workers' and doubles' logs (their directory is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
from bench.provider_bare import BARE  # noqa: E402

PLAY = ROOT / "bench" / "plays" / "started_at.py"
NOOP = ROOT / "examples" / "plays" / "noop.py"
ARGV = ["{python}", "runner.py", "--timeout", "60"]


def doubles() -> dict[str, Any]:
    from tests.doubles.base import discover

    return {k: v for k, v in discover().items() if k in BARE}


def started_at(provider: Any, sandbox_id: str) -> float:
    for _ in range(100):  # untimed: a double may answer before the file is visible to it
        found = provider.read_file(sandbox_id, ".playrun/started.json", max_bytes=4096)
        if found is not None and found.data:
            return float(json.loads(found.data)["at"])
        time.sleep(0.02)
    raise RuntimeError(f"no start record in {sandbox_id}")


def bare_start(name: str, double: Any, adapter: Any, files: dict[str, bytes]) -> float:
    """One bare start: seconds from before the create to the runner's start record."""
    env = {"PLAYRUN_GATEWAY_URL": "http://127.0.0.1:9"}  # the runner's push fails: untimed
    t0 = time.time()
    sandbox_id, delete = BARE[name](double, files, ARGV, env)
    at = started_at(adapter, sandbox_id)
    delete()
    return at - t0


def worker_env(env: dict[str, str], double: Any, log_dir: Path, name: str) -> dict[str, str]:
    return {
        **os.environ, **env, **double.env,
        "PLAYRUN_SANDBOX_PROVIDER": double.name,
        "PLAYRUN_GATEWAY_PUBLIC_URL": env["PLAYRUN_GATEWAY_URL"],
        "PLAYRUN_SANDBOX_ROOT": str(log_dir / f"root-{name}"),
    }


@contextmanager
def worker_on(env: dict[str, str], double: Any, log_dir: Path, name: str,
              concurrency: int) -> Iterator[Any]:
    worker = start_worker(worker_env(env, double, log_dir, name), log_dir, name,
                          concurrency=concurrency, beat=True)
    try:
        yield worker
    finally:
        worker.stop()


STAGES = ("submit -> attempt started", "attempt started -> sandbox requested",
          "sandbox requested -> sandbox live", "sandbox live -> runner started")


def stages(run_id: str, t0: float, started: float) -> list[float]:
    """Seconds between the ledger's marks (database clock, this machine's)."""
    import sqlalchemy as sa

    from models import RunEvent
    from tasks.store.db import session_scope

    with session_scope(readonly=True) as session:
        at = dict(session.execute(sa.select(RunEvent.kind, sa.func.min(RunEvent.at))
                                  .where(RunEvent.run_id == run_id)
                                  .group_by(RunEvent.kind)).all())
    marks = [t0, *(at[k].timestamp() for k in ("attempt.started", "sandbox.requested",
                                               "sandbox.live")), started]
    return [b - a for a, b in zip(marks, marks[1:], strict=False)]


PARTS: dict[str, list[list[float]]] = {}


def playrun_start(run: int) -> tuple[float, list[float]]:
    """One start through playrun: seconds from submit to the runner's start record, and
    the stages between."""
    import tasks

    t0 = time.time()
    handle = tasks.submit_run(PLAY, input={"i": run}, org_id="bench")
    result = handle.wait(timeout=120)
    assert result.status == "succeeded", result
    started = float(result.output["started_at"])
    return started - t0, stages(handle.id, t0, started)


def overhead(double: Any, env: dict[str, str], log_dir: Path, n: int,
             spacing: float) -> tuple[list[float], list[float]]:
    """Bare and playrun starts take turns, one at a time (both see the same machine noise;
    this host is shared), each start spaced past the start-rate bucket's interval."""
    from tasks.acquisition.sandbox import runner_files
    from tasks.sandbox.providers import bootstrap

    adapter = double.provider(log_dir / "bare")
    files = {"play.py": PLAY.read_bytes(), "input.json": b"{}", **runner_files(),
             bootstrap.BOOT_FILE: bootstrap.boot_source()}
    bare: list[float] = []
    full: list[float] = []
    parts = PARTS.setdefault(double.name, [[] for _ in STAGES])
    with worker_on(env, double, log_dir, f"overhead-{double.name}", 2):
        for i in range(n + 4):  # the first four warm the SDK clients (each pool process's)
            t0 = time.time()
            b = bare_start(double.name, double, adapter, files)
            time.sleep(max(0.0, spacing - (time.time() - t0)))
            t0 = time.time()
            f, stage = playrun_start(i)
            time.sleep(max(0.0, spacing - (time.time() - t0)))
            if i >= 4:
                bare.append(b)
                full.append(f)
                for k, part in enumerate(stage):
                    parts[k].append(part)
    return bare, full


def reset_bucket(provider: str) -> None:
    """A fresh start-rate bucket for the provider (what a new deployment starts from)."""
    from tasks.constants import KEY_START_RATE
    from tasks.store import redisconn

    client = redisconn.client(os.environ["PLAYRUN_REDIS_URL"])
    for key in client.scan_iter(f"{KEY_START_RATE}{{{provider}}}*"):
        client.delete(key)
    client.close()


def goodput(double: Any, env: dict[str, str], log_dir: Path, duration: float, warmup: float,
            backlog: int) -> dict[str, float]:
    """Closed loop: `backlog` runs outstanding at all times; the double's counters read at
    the end of the warm-up and at the end."""
    import tasks
    from tasks.store.db import session_scope

    reset_bucket(double.name)
    outstanding: list[str] = []
    statuses: dict[str, int] = {}
    with worker_on(env, double, log_dir, f"goodput-{double.name}", 4):
        t0 = time.monotonic()
        mark: tuple[float, int, int] | None = None
        while (now := time.monotonic()) - t0 < warmup + duration:
            if mark is None and now - t0 >= warmup:
                mark = (now, double.creates(), double.rejected_429())
            outstanding = _still_running(outstanding, statuses, session_scope)
            while len(outstanding) < backlog:
                outstanding.append(tasks.submit_run(NOOP, input={}, org_id="goodput").id)
            time.sleep(0.5)
        end = (time.monotonic(), double.creates(), double.rejected_429())
    assert mark is not None
    minutes = (end[0] - mark[0]) / 60
    creates, refused = end[1] - mark[1], end[2] - mark[2]
    return {"per_min": creates / minutes, "creates": creates, "refused": refused,
            "minutes": minutes, "total_creates": end[1], "total_refused": end[2],
            **{f"runs_{k}": v for k, v in statuses.items()}}


def _still_running(ids: list[str], statuses: dict[str, int], session_scope: Any) -> list[str]:
    import sqlalchemy as sa

    from models import Run

    if not ids:
        return ids
    with session_scope(readonly=True) as session:
        rows = dict(session.execute(sa.select(Run.id, Run.status).where(Run.id.in_(ids))).all())
    left = []
    for run_id in ids:
        status = str(rows.get(run_id, "queued"))
        if status in ("succeeded", "failed", "cancelled"):
            statuses[status] = statuses.get(status, 0) + 1
        else:
            left.append(run_id)
    return left


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--providers", default="daytona,e2b,modal,agentcore")
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("--rate", type=float, default=60.0, help="R: the double's creates/min")
    parser.add_argument("--duration", type=float, default=180.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--backlog", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("overhead", "goodput"))
    args = parser.parse_args()
    if args.quick:
        args.duration, args.warmup = 60.0, 30.0
    stop_on_sigterm()
    found = doubles()
    names = [p for p in args.providers.split(",") if p]
    unknown = [p for p in names if p not in found]
    if unknown:
        raise SystemExit(f"no double or SDK for {unknown}; have {sorted(found)}")
    log_dir = Path(tempfile.mkdtemp(prefix="bench-providers-"))
    if os.environ.get("BENCH_KEEP_LOGS"):
        print(f"logs in {log_dir}")
    results: dict[str, tuple[list[float], list[float]]] = {}
    rates: dict[str, dict[str, float]] = {}
    children = []
    try:
        with bench_env(redis_db=13) as env:
            env.update(gateway_env(log_dir))
            env.update({"PLAYRUN_METRICS_DIR": str(log_dir / "metrics"),
                        "PLAYRUN_METRICS_WORKER_ADDR": "127.0.0.1:0",
                        "PLAYRUN_METRICS_BEAT_ADDR": "127.0.0.1:0",
                        "PLAYRUN_METRICS_GATEWAY_ADDR": "127.0.0.1:0"})
            os.environ.update(env)
            from tasks.settings import reset_settings

            reset_settings()
            children.append(start_gateway({**os.environ, **env}, log_dir))
            for name in names:
                if args.only != "goodput":
                    with found[name](log_dir / f"double-{name}") as double:
                        results[name] = overhead(double, env, log_dir, args.n, 1.2)
                        report_overhead({name: results[name]})
                if args.only != "overhead":
                    with found[name](log_dir / f"double-{name}-r",
                                     creates_per_min=args.rate) as double:
                        rates[name] = goodput(double, env, log_dir, args.duration,
                                              args.warmup, args.backlog)
                        report_goodput({name: rates[name]}, args)
    finally:
        for child in reversed(children):
            child.stop()
    print()
    print(f"==== summary: n = {args.n}, R = {args.rate:g}/min, {args.duration:g} s after a "
          f"{args.warmup:g} s warm-up, backlog {args.backlog}; 2 shared cores")
    report_overhead(results)
    report_goodput(rates, args)
    if not os.environ.get("BENCH_KEEP_LOGS"):
        shutil.rmtree(log_dir, ignore_errors=True)


def report_overhead(overhead: dict[str, tuple[list[float], list[float]]]) -> None:
    if not overhead:
        return
    print(f"\n(a) submit -> runner started  {'bare SDK p50':>12} {'playrun p50':>12} "
          f"{'ratio':>6} {'bare p99':>9} {'playrun p99':>12} {'ratio':>6}")
    for name, (bare, full) in overhead.items():
        b50, f50, b99, f99 = pct(bare, 50), pct(full, 50), pct(bare, 99), pct(full, 99)
        print(f"    {name:26}{b50 * 1000:10.0f}ms {f50 * 1000:10.0f}ms {f50 / b50:5.2f}x "
              f"{b99 * 1000:7.0f}ms {f99 * 1000:10.0f}ms {f99 / b99:5.2f}x")
        for label, values in zip(STAGES, PARTS.get(name, []), strict=False):
            print(f"        {label:38} p50 {pct(values, 50) * 1000:6.0f}ms  "
                  f"p99 {pct(values, 99) * 1000:6.0f}ms")


def report_goodput(rates: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    if not rates:
        return
    print(f"\n(b) goodput at R = {args.rate:g}/min  {'creates/min':>11} {'/ R':>6} "
          f"{'429s':>5} {'429s/creates':>12}   runs ended")
    for name, r in rates.items():
        ended = {k[5:]: int(v) for k, v in r.items() if k.startswith("runs_")}
        print(f"    {name:26}{r['per_min']:11.1f} {r['per_min'] / args.rate:6.2f} "
              f"{int(r['refused']):5d} {r['refused'] / max(1, r['creates']):12.1%}   {ended}")


if __name__ == "__main__":
    main()
