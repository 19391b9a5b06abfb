"""Submit-to-terminal latency of a no-op play through playrun (real worker, PostgreSQL,
Redis, local sandbox), side by side with the bare cost of the same runner in a bare
local sandbox (create, exec, poll to exit, read result, delete).

    python bench/bench_latency.py [-n 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import bench_env, pct, summary  # noqa: E402

PLAY = ROOT / "examples" / "plays" / "noop.py"


def bare_sandbox(n: int) -> list[float]:
    from tasks.acquisition.sandbox import runner_source
    from tasks.sandbox import SandboxSpec, get_provider

    provider = get_provider("local", Path(tempfile.mkdtemp(prefix="bench-bare-")))
    files = {"play.py": PLAY.read_bytes(), "input.json": b"{}", "runner.py": runner_source()}
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        ref = provider.create(SandboxSpec(labels={"bench": "1"}, files=files))
        provider.exec_detached(ref.sandbox_id, ["{python}", "runner.py", "--timeout", "60"],
                               env={}, timeout_s=65)
        while provider.poll(ref.sandbox_id).state == "running":
            time.sleep(0.005)
        result = provider.read_file(ref.sandbox_id, "result.json", max_bytes=1 << 20)
        assert result is not None and json.loads(result.data)["status"] == "succeeded"
        provider.delete(ref.sandbox_id)
        times.append(time.perf_counter() - t0)
    return times


def through_playrun(n: int, env: dict[str, str]) -> list[float]:
    import tasks

    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--concurrency=2",
         "--loglevel=WARNING", "--without-mingle", "--without-gossip"],
        env={**os.environ, **env}, cwd=str(ROOT), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert tasks.submit_run(PLAY, input={}, org_id="warm").wait(timeout=60).status \
            == "succeeded"
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            result = tasks.submit_run(PLAY, input={"i": i}, org_id="bench").wait(timeout=60)
            times.append(time.perf_counter() - t0)
            assert result.status == "succeeded"
        return times
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=40)
    args = parser.parse_args()
    with bench_env(redis_db=12) as env:
        # Measure the runtime, not the default 60 starts/min pacing (one start a second).
        env["PLAYRUN_START_RATE_INITIAL_PER_MIN"] = "60000"
        env["PLAYRUN_START_RATE_MAX_PER_MIN"] = "60000"
        bare = bare_sandbox(args.n)
        full = through_playrun(args.n, env)
    print(f"{'path':34} {'':>1}{'latency, no-op play':>50}")
    print(f"{'bare local sandbox + runner':34} {summary(bare)}")
    print(f"{'playrun submit -> terminal':34} {summary(full)}")
    print(f"{'ratio (playrun / bare)':34} p50 {pct(full, 50) / pct(bare, 50):8.2f}x     "
          f"p99 {pct(full, 99) / pct(bare, 99):8.2f}x")
    print(f"{'overhead per run (p50)':34} {(pct(full, 50) - pct(bare, 50)) * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
