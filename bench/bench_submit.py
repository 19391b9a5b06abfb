"""Admission throughput: tasks.submit_run against plain Celery .delay() of a no-op task,
side by side on the same Redis (no worker consumes either; we measure the enqueue side).

    python bench/bench_submit.py [-n 500]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import bench_env

PLAY = Path(__file__).resolve().parent.parent / "examples" / "plays" / "noop.py"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=500)
    args = parser.parse_args()
    with bench_env(redis_db=13) as env:
        from celery import Celery

        import tasks

        plain = Celery("plain", broker=env["PLAYRUN_REDIS_URL"])

        @plain.task(name="bench.noop")
        def noop() -> None:
            return None

        noop.delay()  # connect before timing
        tasks.submit_run(PLAY, input={}, org_id="warm")

        t0 = time.perf_counter()
        for _ in range(args.n):
            noop.delay()
        plain_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        for i in range(args.n):
            tasks.submit_run(PLAY, input={"i": i}, org_id="bench", idempotency_key=f"k{i}")
        submit_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        for i in range(args.n):
            tasks.submit_run(PLAY, input={"i": i}, org_id="bench", idempotency_key=f"k{i}")
        dup_s = time.perf_counter() - t0

        print(f"{'what':42} {'per second':>12} {'ratio to .delay()':>18}")
        base = args.n / plain_s
        for label, secs in [("plain Celery noop.delay()", plain_s),
                            ("tasks.submit_run (new run)", submit_s),
                            ("tasks.submit_run (idempotent repeat)", dup_s)]:
            rate = args.n / secs
            print(f"{label:42} {rate:12.0f} {rate / base:18.3f}")


if __name__ == "__main__":
    main()
