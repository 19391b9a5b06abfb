"""What metrics cost on the hot path: submit throughput and a no-op play's submit -> terminal
p50, with metrics on and off side by side in one run.

    python bench/bench_metrics.py [-n 600] [--runs 40]

Submit: `tasks.submit_run` in this process, blocks of runs alternating on/off (ABBA...),
so a drift in the shared machine's load hits both sides alike. End to end: a real gateway
and worker (local sandbox) per block, restarted with PLAYRUN_METRICS_ENABLED flipped, in
the order on, off, off, on; while metrics are on, a scraper reads the worker's and the
gateway's endpoints every second (Prometheus usually scrapes every 15 s). Prints the
ratios on/off (goal >= 0.95 for throughput and for speed, off p50 / on p50) and the load
average seen.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

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

PLAY = ROOT / "examples" / "plays" / "noop.py"
ORDER = (True, False, False, True)


def switch(on: bool) -> None:
    """Flip metrics in this process (the app side of submit_run)."""
    from tasks import metrics
    from tasks.settings import reset_settings

    os.environ["PLAYRUN_METRICS_ENABLED"] = "true" if on else "false"
    reset_settings()
    metrics.reset()
    assert metrics.enabled() == on


def submit_rates(n: int) -> dict[bool, float]:
    import tasks

    tasks.submit_run(PLAY, input={}, org_id="warm")
    spent = {True: 0.0, False: 0.0}
    done = {True: 0, False: 0}
    block = max(n // 12, 1)
    for i in range(12):
        on = ORDER[i % 4]
        switch(on)
        t0 = time.perf_counter()
        for j in range(block):
            tasks.submit_run(PLAY, input={"i": j}, org_id="bench-submit")
        spent[on] += time.perf_counter() - t0
        done[on] += block
    return {on: done[on] / spent[on] for on in (True, False)}


def call_cost(n: int = 200_000) -> dict[bool, float]:
    """Seconds per hot-path call (a labelled counter), metrics on and off: the floor under
    the noisy end-to-end figures."""
    from tasks import metrics

    out = {}
    for on in (True, False):
        switch(on)
        t0 = time.perf_counter()
        for _ in range(n):
            metrics.permit("bench", True)
        out[on] = (time.perf_counter() - t0) / n
    return out


def _scrape_forever(urls: list[str], stop: threading.Event) -> None:
    while not stop.wait(1.0):
        for url in urls:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(url, timeout=5)


def _url(env: dict[str, str], kind: str, pid: int) -> str:
    path = Path(env["PLAYRUN_METRICS_DIR"]) / f"{kind}-{pid}.url"
    deadline = time.monotonic() + 30
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no metrics URL at {path}")
        time.sleep(0.05)
    return path.read_text().strip()


def end_to_end(runs: int, env: dict[str, str], log_dir: Path) -> dict[bool, list[float]]:
    import tasks

    times: dict[bool, list[float]] = {True: [], False: []}
    for k, on in enumerate(ORDER):
        switch(on)
        child_env = {**os.environ, **env, "PLAYRUN_METRICS_ENABLED": "true" if on else "false"}
        children = [start_gateway(child_env, log_dir, f"gateway{k}"),
                    start_worker(child_env, log_dir, f"metrics{k}")]
        stop = threading.Event()
        try:
            if on:
                urls = [_url(env, kind, c.pid) for kind, c in zip(("gateway", "worker"),
                                                                   children, strict=True)]
                threading.Thread(target=_scrape_forever, args=(urls, stop), daemon=True).start()
            for _ in range(3):  # warm: imports, pools, the first sandbox
                assert tasks.submit_run(PLAY, input={}, org_id="warm").wait(timeout=60).status \
                    == "succeeded"
            for i in range(runs // len(ORDER)):
                t0 = time.perf_counter()
                result = tasks.submit_run(PLAY, input={"i": i}, org_id="bench").wait(timeout=60)
                times[on].append(time.perf_counter() - t0)
                assert result.status == "succeeded", result
        finally:
            stop.set()
            for child in reversed(children):
                child.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=600, help="submits (in all)")
    parser.add_argument("--runs", type=int, default=40, help="end-to-end runs (in all)")
    args = parser.parse_args()
    stop_on_sigterm()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-metrics-"))
    load = [os.getloadavg()[0]]
    with bench_env(redis_db=12) as env:
        env["PLAYRUN_START_RATE_INITIAL_PER_MIN"] = "60000"  # measure the runtime, not pacing
        env["PLAYRUN_START_RATE_MAX_PER_MIN"] = "60000"
        env["PLAYRUN_METRICS_DIR"] = str(log_dir / "metrics")
        for kind in ("WORKER", "BEAT", "GATEWAY"):
            env[f"PLAYRUN_METRICS_{kind}_ADDR"] = "127.0.0.1:0"
        env.update(gateway_env(log_dir))
        os.environ.update(env)
        latency = end_to_end(args.runs, env, log_dir)
        load.append(os.getloadavg()[0])
        rates = submit_rates(args.n)  # last: no worker consumes what it enqueues
        load.append(os.getloadavg()[0])
        per_call = call_cost()
    shutil.rmtree(log_dir, ignore_errors=True)
    on50, off50 = pct(latency[True], 50), pct(latency[False], 50)
    print(f"{'':36} {'metrics on':>12} {'metrics off':>12} {'on / off':>9}")
    print(f"{'submit_run, runs/s':36} {rates[True]:12.0f} {rates[False]:12.0f} "
          f"{rates[True] / rates[False]:9.3f}")
    print(f"{'no-op play submit -> terminal, p50':36} {on50 * 1000:9.1f} ms {off50 * 1000:9.1f} ms "
          f"{on50 / off50:9.3f}")
    print(f"{'one counter call (permit)':36} {per_call[True] * 1e6:9.2f} us "
          f"{per_call[False] * 1e6:9.2f} us")
    print(f"goal >= 0.95: submit throughput on/off {rates[True] / rates[False]:.3f}; "
          f"end-to-end speed on/off (off p50 / on p50) {off50 / on50:.3f}")
    print(f"n = {args.n} submits, {args.runs} runs; load average (1 min) seen: "
          + ", ".join(f"{x:.1f}" for x in load))


if __name__ == "__main__":
    main()
