"""Submit-to-terminal latency of a no-op play through playrun (real worker and gateway,
PostgreSQL, Redis, local sandbox), side by side with the bare cost of the same runner in a
bare local sandbox (create, exec, poll to exit, read result, delete).

    python bench/bench_latency.py [-n 40]

The playrun side is the whole push path: the worker claims, acquires and launches the
runner detached; the runner heartbeats and pushes `complete` to the gateway (a
`playrun gateway` subprocess, over its Unix socket), which settles the run; `wait()`
returns on the terminal. Runs are submitted one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    bench_env,
    gateway_env,
    pct,
    start_gateway,
    start_worker,
    stop_on_sigterm,
    summary,
)

PLAY = ROOT / "examples" / "plays" / "noop.py"


def bare_sandbox(n: int, root: Path) -> list[float]:
    from tasks.acquisition.sandbox import runner_files
    from tasks.sandbox import SandboxSpec, get_provider

    provider = get_provider("local", root)
    files = {"play.py": PLAY.read_bytes(), "input.json": b"{}", **runner_files()}
    times: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        ref = provider.create(SandboxSpec(labels={"bench": "1"}, files=files))
        t1 = time.perf_counter()
        provider.exec_detached(ref.sandbox_id, ["{python}", "runner.py", "--timeout", "60"],
                               env={}, timeout_s=65)
        while provider.poll(ref.sandbox_id).state == "running":
            time.sleep(0.005)
        t2 = time.perf_counter()
        result = provider.read_file(ref.sandbox_id, "result.json", max_bytes=1 << 20)
        assert result is not None and json.loads(result.data)["status"] == "succeeded"
        provider.delete(ref.sandbox_id)
        times.append(time.perf_counter() - t0)
        BARE_PARTS[0].append(t1 - t0)
        BARE_PARTS[1].append(t2 - t1)
        BARE_PARTS[2].append(times[-1] - (t2 - t0))
    return times


# The bare path's own stages: create; exec until exit is seen; read the result + delete.
BARE_PARTS: list[list[float]] = [[], [], []]


STAGES = (
    ("submit committed -> attempt opened", "relay, broker, worker pick-up, claim"),
    ("attempt opened -> sandbox requested", "traffic policy, start permit, capacity"),
    ("sandbox requested -> launch recorded", "provider create, fenced launch record"),
    ("launch recorded -> terminal settled", "tokens, exec, runner, heartbeat, push, settle"),
    ("terminal settled -> wait() returned", "notification to the waiting caller"),
)


def stages(done: list[tuple[str, float]]) -> list[list[float]]:
    """Per run, the seconds spent between the ledger's timestamps (database clock; the last
    stage against this machine's clock, which the database shares)."""
    import sqlalchemy as sa

    from models import Attempt, Run, RunEvent
    from tasks.store.db import session_scope

    out: list[list[float]] = [[] for _ in STAGES]
    with session_scope(readonly=True) as session:
        for run_id, returned_at in done:
            at = dict(session.execute(sa.select(RunEvent.kind, sa.func.min(RunEvent.at))
                                      .where(RunEvent.run_id == run_id)
                                      .group_by(RunEvent.kind)).all())
            launched = session.scalar(sa.select(Attempt.runner_started_at)
                                      .where(Attempt.run_id == run_id))
            finished = session.scalar(sa.select(Run.finished_at).where(Run.id == run_id))
            # sandbox.live and the launch are one statement on PostgreSQL: one stage.
            marks = [at["run.admitted"], at["attempt.started"], at["sandbox.requested"],
                     launched, finished]
            for k in range(len(marks) - 1):
                out[k].append((marks[k + 1] - marks[k]).total_seconds())
            out[-1].append(returned_at - finished.timestamp())
    return out


def through_playrun(n: int, env: dict[str, str], log_dir: Path
                    ) -> tuple[list[float], list[list[float]]]:
    import tasks

    children = []
    try:
        children.append(start_gateway({**os.environ, **env}, log_dir))
        children.append(start_worker({**os.environ, **env}, log_dir, "latency"))
        for _ in range(3):  # warm: imports, pools, the first sandbox
            assert tasks.submit_run(PLAY, input={}, org_id="warm").wait(timeout=60).status \
                == "succeeded"
        times, done = [], []
        for i in range(n):
            t0 = time.perf_counter()
            handle = tasks.submit_run(PLAY, input={"i": i}, org_id="bench")
            result = handle.wait(timeout=60)
            times.append(time.perf_counter() - t0)
            done.append((handle.id, time.time()))
            assert result.status == "succeeded", result
        return times, stages(done)
    finally:
        for child in reversed(children):
            child.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=40)
    args = parser.parse_args()
    stop_on_sigterm()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    with bench_env(redis_db=12) as env:
        # Measure the runtime, not the default 60 starts/min pacing (one start a second).
        env["PLAYRUN_START_RATE_INITIAL_PER_MIN"] = "60000"
        env["PLAYRUN_START_RATE_MAX_PER_MIN"] = "60000"
        env.update(gateway_env(log_dir))
        bare = bare_sandbox(args.n, log_dir / "bare-sandboxes")
        full, parts = through_playrun(args.n, env, log_dir)
    shutil.rmtree(log_dir, ignore_errors=True)
    print(f"n = {args.n} runs each, one at a time; 2 shared cores")
    print(f"{'path':34} {'':>1}{'latency, no-op play':>50}")
    print(f"{'bare local sandbox + runner':34} {summary(bare)}")
    print(f"{'playrun submit -> terminal':34} {summary(full)}")
    print(f"{'ratio (playrun / bare)':34} p50 {pct(full, 50) / pct(bare, 50):8.2f}x     "
          f"p99 {pct(full, 99) / pct(bare, 99):8.2f}x")
    print(f"{'overhead per run (p50)':34} {(pct(full, 50) - pct(bare, 50)) * 1000:8.1f} ms")
    print()
    print(f"{'where bare time goes':38} {'p50 ms':>8} {'p99 ms':>8}")
    for label, values in zip(("create", "exec -> exit seen (runner, no gateway)",
                              "read result + delete"), BARE_PARTS, strict=True):
        print(f"{label:38} {pct(values, 50) * 1000:8.1f} {pct(values, 99) * 1000:8.1f}")
    print(f"{'where playrun time goes':38} {'p50 ms':>8} {'p99 ms':>8}")
    for (label, what), values in zip(STAGES, parts, strict=True):
        print(f"{label:38} {pct(values, 50) * 1000:8.1f} {pct(values, 99) * 1000:8.1f}  {what}")


if __name__ == "__main__":
    main()
