"""Good heartbeats through the gateway while one hostile play abuses it, against the same
probe on a quiet gateway, side by side in one run.

    python bench/bench_noisy.py [--seconds 10] [--rounds 2] [--workers 2]
                                [--isolation process|strict] [--modes quiet,replay]

The stack is real: a `playrun gateway --workers N`, one `celery -A tasks worker`, the local
sandbox provider, PostgreSQL and Redis. A probe play (tests/plays/abuse.py, mode "probe")
sends heartbeats with its own token on 4 connections for --seconds, each as soon as the
last is answered (the gateway gathers beats for up to PLAYRUN_GATEWAY_BEAT_WINDOW_S, so a
round trip is about that), and returns each round trip. Phases, interleaved over --rounds:
the probe alone (quiet), then the probe beside a hostile play of each kind (huge cheap
bodies, 10,000-action batches, step-claim floods, 200 slow connections), and a finished
run's token replayed from outside on 4 connections, each request as soon as the last is
answered. Printed per phase: good heartbeats a second (answered 200), p50 and p99 round
trip, and heartbeats/s as a ratio of quiet's (goal >= 0.8); for the replay also the
requests answered a second, the gateway's and PostgreSQL's CPU a second, and the
gateway's per 1,000 requests.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    bench_env,
    gateway_env,
    pct,
    pg_backends_cpu,
    start_gateway,
    start_worker,
    stop_on_sigterm,
    tree_cpu,
)

PLAY = ROOT / "tests" / "plays" / "abuse.py"
MODES = ("quiet", "huge", "flood", "steps", "connections", "replay")
@dataclass
class Replay:
    """A dead token replayed on 4 connections until stopped (tests/support/replay.py)."""

    url: str
    token: str
    codes: Counter[str] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        from tests.support.replay import replay_on

        self.threads = replay_on(self.url, self.token, self.stop, self._answered)

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _answered(self, answer: Any) -> None:
        with self.lock:
            self.codes[answer.json().get("code", "OK")] += 1


def dead_token(gateway_url: str) -> Replay:
    import tasks

    done = tasks.submit_run(PLAY, input={"mode": "token"},
                            org_id=f"bad-{uuid.uuid4().hex[:6]}").wait(timeout=120)
    if done.status != "succeeded":
        raise SystemExit(f"the token play did not succeed: {done}")
    return Replay(gateway_url + "/v1/runtime", done.output["token"])


def phase(mode: str, seconds: float, replay: Replay | None = None) -> list[float]:
    """The probe's heartbeat round trips (negative: the HTTP status of a refused one)."""
    import tasks

    hostile = None
    if replay is not None:
        replay.start()
    elif mode != "quiet":
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
    if replay is not None:
        replay.join()
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
    parser.add_argument("--modes", default=",".join(MODES),
                        help="phases to run, comma-separated (quiet always runs)")
    args = parser.parse_args()
    asked = [m for m in args.modes.split(",") if m]
    if set(asked) - set(MODES):
        parser.error(f"--modes: unknown {sorted(set(asked) - set(MODES))}; known: {MODES}")
    modes = ["quiet", *(m for m in asked if m != "quiet")]
    stop_on_sigterm()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-noisy-"))
    got: dict[str, list[float]] = {m: [] for m in modes}
    spent: dict[str, float] = dict.fromkeys(modes, 0.0)
    replayed: Counter[str] = Counter()
    replay_cpu = [0.0, 0.0]  # gateway, PostgreSQL: CPU seconds during the replay phases
    with bench_env(redis_db=15) as env:
        env.update(gateway_env(log_dir))
        env.update({"PLAYRUN_SANDBOX_PROVIDER": "local",
                    "PLAYRUN_SANDBOX_ISOLATION": args.isolation,
                    "PLAYRUN_GATEWAY_WORKERS": str(args.workers),
                    "PLAYRUN_START_RATE_INITIAL_PER_MIN": "6000",
                    "PLAYRUN_START_RATE_MAX_PER_MIN": "12000"})
        env = {**os.environ, **env}
        os.environ.update(env)
        database = env["PLAYRUN_DATABASE_URL"].rsplit("/", 1)[1]
        gateway = start_gateway(env, log_dir)
        worker = start_worker(env, log_dir, "worker", concurrency=4, beat=True)
        try:
            for _ in range(args.rounds):
                for mode in modes:
                    replay = dead_token(env["PLAYRUN_GATEWAY_URL"]) if mode == "replay" else None
                    before = (tree_cpu(gateway.pid), pg_backends_cpu(database))
                    got[mode].extend(phase(mode, args.seconds, replay))
                    spent[mode] += args.seconds
                    if replay is not None:
                        replayed.update(replay.codes)
                        replay_cpu[0] += tree_cpu(gateway.pid) - before[0]
                        replay_cpu[1] += pg_backends_cpu(database) - before[1]
        finally:
            worker.stop()
            gateway.stop()
    shutil.rmtree(log_dir, ignore_errors=True)
    print(f"heartbeat probe, {args.seconds:g} s x {args.rounds} round(s) a phase, gateway "
          f"--workers {args.workers}, {args.isolation} isolation, 2 shared cores")
    quiet_rate = sum(1 for t in got["quiet"] if t >= 0) / spent["quiet"]
    for mode in modes:
        good = [t for t in got[mode] if t >= 0]
        rate = len(good) / spent[mode]
        print(f"  {mode:12} {rate:6.1f} good beats/s  p50 {pct(good, 50) * 1000:6.1f} ms  "
              f"p99 {pct(good, 99) * 1000:7.1f} ms  refused {len(got[mode]) - len(good):3d}  "
              f"{rate / quiet_rate:5.2f}x quiet")
    total = sum(replayed.values())
    if total:
        codes = ", ".join(f"{code} {n}" for code, n in replayed.most_common())
        print(f"  replay: {total / spent['replay']:.0f} requests/s answered ({codes}); CPU a "
              f"second: gateway {replay_cpu[0] / spent['replay'] * 1000:.0f} ms, PostgreSQL "
              f"{replay_cpu[1] / spent['replay'] * 1000:.0f} ms; per 1,000 requests: gateway "
              f"{replay_cpu[0] / total * 1e6:.0f} ms")


if __name__ == "__main__":
    main()
