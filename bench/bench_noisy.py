"""Good heartbeats through the gateway while one hostile play abuses it, against the same
probe on a quiet gateway, side by side in one run.

    python bench/bench_noisy.py [--seconds 10] [--rounds 2] [--workers 2]
                                [--isolation process|strict]

The stack is real: a `playrun gateway --workers N`, one `celery -A tasks worker`, the local
sandbox provider, PostgreSQL and Redis. A probe play (tests/plays/abuse.py, mode "probe")
sends heartbeats with its own token on 4 connections for --seconds, each as soon as the
last is answered (the gateway gathers beats for up to PLAYRUN_GATEWAY_BEAT_WINDOW_S, so a
round trip is about that), and returns each round trip. Phases, interleaved over --rounds:
the probe alone (quiet), then the probe beside a hostile play of each kind (huge cheap
bodies, 10,000-action batches, step-claim floods, 200 slow connections). Printed per phase:
good heartbeats a second (answered 200), p50 and p99 round trip, and heartbeats/s as a
ratio of quiet's (goal >= 0.8).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
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
)

PLAY = ROOT / "tests" / "plays" / "abuse.py"
MODES = ("quiet", "huge", "flood", "steps", "connections")


def phase(mode: str, seconds: float) -> list[float]:
    """The probe's heartbeat round trips (negative: the HTTP status of a refused one)."""
    import tasks

    hostile = None
    if mode != "quiet":
        hostile = tasks.submit_run(PLAY, input={"mode": mode, "seconds": seconds + 4},
                                   org_id=f"bad-{uuid.uuid4().hex[:6]}")
        deadline = time.monotonic() + 60
        while not any(e.kind == "run.progress" for e in tasks.run_events(hostile.id)):
            if time.monotonic() > deadline:
                raise SystemExit(f"the hostile play ({mode}) never started")
            time.sleep(0.1)
    probe = tasks.submit_run(PLAY, input={"mode": "probe", "seconds": seconds,
                                          "threads": 4, "pause": 0},
                             org_id=f"good-{uuid.uuid4().hex[:6]}")
    result = probe.wait(timeout=seconds + 120)
    if hostile is not None:
        hostile.wait(timeout=seconds + 120)
    if result.status != "succeeded":
        raise SystemExit(f"the probe did not succeed beside {mode}: {result}")
    beats: list[float] = result.output["beats"]
    return beats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--isolation", choices=("process", "strict"), default="process")
    args = parser.parse_args()
    stop_on_sigterm()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-noisy-"))
    got: dict[str, list[float]] = {m: [] for m in MODES}
    spent: dict[str, float] = dict.fromkeys(MODES, 0.0)
    with bench_env(redis_db=15) as env:
        env.update(gateway_env(log_dir))
        env.update({"PLAYRUN_SANDBOX_PROVIDER": "local",
                    "PLAYRUN_SANDBOX_ISOLATION": args.isolation,
                    "PLAYRUN_GATEWAY_WORKERS": str(args.workers),
                    "PLAYRUN_START_RATE_INITIAL_PER_MIN": "6000",
                    "PLAYRUN_START_RATE_MAX_PER_MIN": "12000"})
        env = {**os.environ, **env}
        os.environ.update(env)
        gateway = start_gateway(env, log_dir)
        worker = start_worker(env, log_dir, "worker", concurrency=4, beat=True)
        try:
            for _ in range(args.rounds):
                for mode in MODES:
                    got[mode].extend(phase(mode, args.seconds))
                    spent[mode] += args.seconds
        finally:
            worker.stop()
            gateway.stop()
    shutil.rmtree(log_dir, ignore_errors=True)
    print(f"heartbeat probe, {args.seconds:g} s x {args.rounds} round(s) a phase, gateway "
          f"--workers {args.workers}, {args.isolation} isolation, 2 shared cores")
    quiet_rate = sum(1 for t in got["quiet"] if t >= 0) / spent["quiet"]
    for mode in MODES:
        good = [t for t in got[mode] if t >= 0]
        rate = len(good) / spent[mode]
        print(f"  {mode:12} {rate:6.1f} good beats/s  p50 {pct(good, 50) * 1000:6.1f} ms  "
              f"p99 {pct(good, 99) * 1000:7.1f} ms  refused {len(got[mode]) - len(good):3d}  "
              f"{rate / quiet_rate:5.2f}x quiet")


if __name__ == "__main__":
    main()
