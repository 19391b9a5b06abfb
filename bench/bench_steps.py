"""ctx.step through a real gateway process (PostgreSQL): a step on a completed receipt
(one claim answered `reuse`) and on a new key (claim, run, complete: two round trips),
per call, side by side with a bare heartbeat round trip on the same connection path.
The caller is the sandbox's own code (runner_steps.Steps over playrun_client), talking
to the gateway's Unix socket as a sandbox does.

    python bench/bench_steps.py [-n 500]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import bench_env, pct, summary  # noqa: E402
from tasks.host.processes import free_port  # noqa: E402

PLAY = ROOT / "examples" / "plays" / "noop.py"


def start_gateway(env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = Path(env["PLAYRUN_GATEWAY_SOCKET"]).parent.parent / "gateway.log"
    proc = subprocess.Popen([sys.executable, "-m", "tasks.cli.main", "gateway"],
                            env={**os.environ, **env}, cwd=str(ROOT),
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                            start_new_session=True)
    deadline = time.monotonic() + 30
    while b"ready" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(log.read_text())
        time.sleep(0.05)
    return proc


def launched_uplink() -> Any:
    """An attempt claimed and launched by hand, and the runner's uplink for it."""
    import sqlalchemy as sa

    from models import Outbox, db_now
    from tasks.acquisition.claim import Claimed, claim
    from tasks.admission.submit import admit
    from tasks.execution import runner_client
    from tasks.execution.launch import mark_launching
    from tasks.security import tokens
    from tasks.settings import get_settings
    from tasks.store.db import session_scope

    settings = get_settings()
    admitted = admit(PLAY, {}, "bench", None)
    with session_scope() as session:
        session.execute(sa.update(Outbox).where(Outbox.id == admitted.outbox_id)
                        .values(sent_at=db_now()))
    with session_scope() as session:
        claimed = claim(session, admitted.run_id, worker_id="bench", lease_seconds=60)
    assert isinstance(claimed, Claimed)
    launch_id = mark_launching(claimed.fence, settings)
    assert launch_id is not None
    token = tokens.mint(org_id="bench", run_id=admitted.run_id,
                        generation=claimed.fence.generation, launch_id=launch_id,
                        capabilities=tokens.RUNNER_CAPABILITIES, ttl_s=3600,
                        secret=settings.secret_key)
    gateway = runner_client.Gateway(settings.gateway_url, str(settings.gateway_socket))
    return runner_client.Uplink(gateway, token, "", launch_id, 5.0, print)


def timed(n: int, call: Callable[[int], object]) -> list[float]:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=500)
    args = parser.parse_args()
    with bench_env(redis_db=14) as env:
        home = Path(tempfile.mkdtemp(prefix="bench-steps-"))
        env.update({"PLAYRUN_GATEWAY_URL": f"http://127.0.0.1:{free_port()}",
                    "PLAYRUN_GATEWAY_SOCKET": str(home / "gw" / "gateway.sock")})
        os.environ.update(env)
        gateway = start_gateway(env)
        try:
            from tasks.execution import runner_steps

            uplink = launched_uplink()
            steps = runner_steps.Steps(uplink, time.monotonic() + 3600)
            beat = {"action": "heartbeat"}
            for i in range(20):  # warm both paths and the pool
                uplink.gateway.call(uplink.token, beat)
                steps.step(f"warm-{i}", lambda: {"warm": True})
            steps.step("done", lambda: {"company": "acme", "employees": 12})
            bare = timed(args.n, lambda _i: uplink.gateway.call(uplink.token, beat))
            reuse = timed(args.n, lambda _i: steps.step("done", lambda: None))
            new = timed(args.n, lambda i: steps.step(f"new-{i}", lambda: {"i": i}))
        finally:
            os.killpg(gateway.pid, 15)
            gateway.wait(timeout=30)
    print(f"{'per call (n=' + str(args.n) + ')':34} latency")
    print(f"{'bare heartbeat round trip':34} {summary(bare)}")
    print(f"{'ctx.step, completed receipt':34} {summary(reuse)}")
    print(f"{'ctx.step, new key (fn trivial)':34} {summary(new)}")
    for name, values in (("reuse / heartbeat", reuse), ("new / heartbeat", new)):
        print(f"{name:34} p50 {pct(values, 50) / pct(bare, 50):8.2f}x     "
              f"p99 {pct(values, 99) / pct(bare, 99):8.2f}x")


if __name__ == "__main__":
    main()
