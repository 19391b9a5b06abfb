"""What metrics cost on the hot path: submit throughput and a no-op play's submit -> terminal
p50, with metrics on and off side by side in one run.

    python bench/bench_metrics.py [-n 600] [--runs 40]

Submit: `tasks.submit_run` in this process, blocks of runs alternating on/off (ABBA...),
so a drift in the shared machine's load hits both sides alike. End to end: two real
stacks (gateway + worker, local sandbox) at once, one with PLAYRUN_METRICS_ENABLED=false,
runs alternating between them one at a time (ABBA); a scraper reads the metrics stack's
worker and gateway endpoints every second (Prometheus usually scrapes every 15 s). Prints the
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
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    bench_env,
    claim_redis_db,
    gateway_env,
    pct,
    start_gateway,
    start_worker,
    stop_on_sigterm,
)

PLAY = ROOT / "examples" / "plays" / "noop.py"
ORDER = (True, False, False, True)
REDIS_BASE = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379")


def claim_free_db(taken: str) -> str:
    """The metrics-off stack's broker: a second bench db (the first, `taken`, is marked
    ours already), flushed at the end."""
    return f"{REDIS_BASE}/{claim_redis_db(REDIS_BASE, 15)}"


def switch(on: bool, env: dict[str, str] | None = None) -> None:
    """Flip metrics in this process (the app side of submit_run), and point it at a stack."""
    from tasks.observe import metrics
    from tasks.settings import reset_settings

    os.environ.update(env or {})
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
    from tasks.observe import metrics

    out = {}
    for on in (True, False):
        switch(on)
        t0 = time.perf_counter()
        for _ in range(n):
            metrics.permit("bench", True)
        out[on] = (time.perf_counter() - t0) / n
    return out


def _app_on(broker: str) -> Any:
    """playrun's Celery settings on another broker (this process's app is bound to one)."""
    from celery import Celery

    app = Celery("playrun")
    app.config_from_object("celeryconfig")
    app.conf.broker_url = app.conf.result_backend = broker
    return app


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


def end_to_end(runs: int, env: dict[str, str], log_dir: Path, off_redis: str
               ) -> dict[bool, list[float]]:
    """Two stacks side by side on one database, each with its own Redis db, gateway and
    worker: metrics on in one, off in the other; runs alternate between them (ABBA), so
    the shared machine's load hits both alike."""
    import redis

    import tasks
    from tasks.admission.relay import publish_admitted
    from tasks.admission.submit import admit
    from tasks.broker.app import app as celery_app
    from tasks.broker.publish import CeleryPublisher, use
    from tasks.constants import TASK_START_ATTEMPT

    stacks: dict[bool, dict[str, str]] = {}
    children = []
    stop = threading.Event()
    try:
        for on in (True, False):
            own = {**env, "PLAYRUN_METRICS_ENABLED": "true" if on else "false",
                   "PLAYRUN_REDIS_URL": env["PLAYRUN_REDIS_URL"] if on else off_redis,
                   **gateway_env(log_dir / ("on" if on else "off"))}
            stacks[on] = own
            name = "on" if on else "off"
            child_env = {**os.environ, **own}
            gateway = start_gateway(child_env, log_dir, f"gateway-{name}")
            worker = start_worker(child_env, log_dir, f"worker-{name}")
            children += [gateway, worker]
            if on:
                urls = [_url(own, "gateway", gateway.pid), _url(own, "worker", worker.pid)]
                threading.Thread(target=_scrape_forever, args=(urls, stop), daemon=True).start()

        publishers = {True: CeleryPublisher(celery_app),
                      False: CeleryPublisher(_app_on(off_redis))}

        def one(on: bool, i: int) -> float:
            """submit_run's two steps, published to the chosen stack's broker."""
            switch(on, stacks[on])  # wait() listens on that stack's Redis
            t0 = time.perf_counter()
            admitted = admit(PLAY, {"i": i}, "bench", None)
            assert admitted.outbox_id is not None
            use(publishers[on])
            publish_admitted([(admitted.outbox_id, TASK_START_ATTEMPT, [admitted.run_id])])
            result = tasks.RunHandle(admitted.run_id).wait(timeout=60)
            assert result.status == "succeeded", result
            return time.perf_counter() - t0

        for on in (True, False):  # warm: imports, pools, the first sandbox
            for i in range(3):
                one(on, i)
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(runs):
            on = ORDER[i % len(ORDER)]
            times[on].append(one(on, i))
        return times
    finally:
        stop.set()
        for child in reversed(children):
            child.stop()
        redis.Redis.from_url(off_redis).flushdb()  # empty and marked ours when claimed
        os.environ["PLAYRUN_REDIS_URL"] = env["PLAYRUN_REDIS_URL"]  # bench_env cleans that one


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
        latency = end_to_end(args.runs, env, log_dir, claim_free_db(env["PLAYRUN_REDIS_URL"]))
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
