"""Gateway `heartbeat` requests/s and latency, side by side with a bare endpoint on the same
uvicorn server that commits one single-row UPDATE on the same database.

    python bench/bench_gateway.py [--seconds 4] [--clients 8] [--attempts 200] [--rounds 2]

One uvicorn server (a subprocess, configured like `playrun gateway`) serves three mounts:
  /bare       a bare Starlette route: read the JSON body, UPDATE one attempts row, commit
              (same engine, pool and threadpool as the gateway's actions)
  /default    the gateway app (tasks.gateway.app.create_app) with the default settings: a
              beat is a fenced read, and renews the lease at most once per 10 s per attempt;
              the per-attempt budgets are checked in Redis (one admit script and one
              pipelined release per request)
  /memory     the same app with the budgets in the process's memory
              (PLAYRUN_GATEWAY_SHARED_BUDGETS=false, what every process did before)
  /renew      the same app with a tiny heartbeat timeout, so every beat also writes its lease
K launched attempts (admitted, claimed, mark_launching) get real runner tokens; C client
threads in this process drive keep-alive HTTP/1.1 connections for a fixed time per phase.
Phases are interleaved (bare, default, renew, renew, default, bare, ...) to spread noise.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import Child, bench_env, free_port, pct, start_child, stop_on_sigterm  # noqa: E402

NOOP = ROOT / "examples" / "plays" / "noop.py"
MOUNTS = ("bare", "default", "memory", "renew")
LABELS = {
    "bare": "bare route: 1-row UPDATE + commit",
    "default": "gateway heartbeat (default)",
    "memory": "gateway heartbeat (budgets in memory)",
    "renew": "gateway heartbeat (writes each beat)",
}


# --- the server (a subprocess: `bench_gateway.py --serve PORT`) ---------------------------

def serve(port: int) -> None:
    import sqlalchemy as sa
    import uvicorn
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Mount, Route

    from tasks.gateway.app import create_app
    from tasks.settings import get_settings
    from tasks.store.db import session_scope

    settings = get_settings()

    def no_send(_name: str, _args: list[Any], _queue: str) -> None:
        return None

    update = sa.text("UPDATE attempts SET last_heartbeat_at = clock_timestamp() "
                     "WHERE run_id = :run AND generation = 1")

    async def bare(request: Request) -> JSONResponse:
        doc = json.loads(await request.body())

        def write() -> int:
            with session_scope() as session:
                return int(session.execute(update, {"run": doc["run"]}).rowcount)  # type: ignore[attr-defined]

        return JSONResponse({"ok": True, "result": {"updated": await run_in_threadpool(write)}})

    app = Starlette(routes=[
        Mount("/bare", Starlette(routes=[Route("/v1/runtime", bare, methods=["POST"])])),
        Mount("/default", create_app(settings, no_send)),
        Mount("/memory", create_app(settings.model_copy(
            update={"gateway_shared_budgets": False}), no_send)),
        # renew_every = timeout / 3 = 10 ms: with K attempts beaten in turn, every beat writes.
        Mount("/renew", create_app(settings.model_copy(update={"heartbeat_timeout_s": 0.03}),
                                   no_send)),
    ])
    # As `playrun gateway` runs it (tasks/gateway/serve.py).
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                lifespan="off")


# --- set-up and clients -------------------------------------------------------------------

def launched_attempts(k: int) -> list[tuple[str, str]]:
    """K runs with a claimed, launched attempt; (run_id, runner token) each."""
    from tasks.acquisition.claim import Claimed, claim
    from tasks.admission.submit import admit
    from tasks.execution.launch import mark_launching
    from tasks.security import tokens
    from tasks.settings import get_settings
    from tasks.store.db import session_scope

    settings = get_settings()
    org = f"bench-gw-{uuid.uuid4().hex[:6]}"
    out = []
    for _ in range(k):
        run_id = admit(NOOP, {}, org, None).run_id
        with session_scope() as session:
            claimed = claim(session, run_id, worker_id="bench", lease_seconds=3600)
        assert isinstance(claimed, Claimed)
        launch_id = mark_launching(claimed.fence, settings)
        assert launch_id is not None
        token = tokens.mint(org_id=org, run_id=run_id, generation=claimed.fence.generation,
                            launch_id=launch_id, capabilities=tokens.RUNNER_CAPABILITIES,
                            ttl_s=3600, secret=settings.secret_key)
        out.append((run_id, token))
    return out


def expire_leases(attempts: list[tuple[str, str]]) -> None:
    """Leases due for renewal now (mark_launching gave them 40 s), so every beat writes."""
    import sqlalchemy as sa

    from tasks.store.db import session_scope

    with session_scope() as session:
        session.execute(sa.text("UPDATE attempts SET lease_expires_at = clock_timestamp() "
                                "WHERE run_id = ANY(:ids)"), {"ids": [r for r, _ in attempts]})


class Phase:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}
        self.renewed = 0
        self.seconds = 0.0

    def add(self, other: Phase) -> None:
        self.latencies += other.latencies
        self.renewed += other.renewed
        self.seconds += other.seconds
        for k, v in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + v

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds


def drive(port: int, mount: str, attempts: list[tuple[str, str]], clients: int,
          seconds: float) -> Phase:
    phase = Phase()
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(index: int) -> None:
        mine = attempts[index::clients]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        lat: list[float] = []
        errors: dict[str, int] = {}
        renewed = 0
        path = f"/{mount}/v1/runtime"
        bodies = [json.dumps({"run": r} if mount == "bare" else {"action": "heartbeat"}).encode()
                  for r, _ in mine]
        headers = [{"Authorization": f"Bearer {t}", "Content-Type": "application/json"}
                   for _, t in mine]
        i = 0
        start.wait()
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at[0]:
                break
            j = i % len(mine)
            conn.request("POST", path, body=bodies[j], headers=headers[j])
            resp = conn.getresponse()
            doc = json.loads(resp.read())
            lat.append(time.perf_counter() - t0)
            if resp.status != 200 or not doc.get("ok"):
                key = f"{resp.status} {doc.get('code')}"
                errors[key] = errors.get(key, 0) + 1
            elif doc["result"].get("renewed") or doc["result"].get("updated"):
                renewed += 1
            i += 1
        conn.close()
        with lock:
            phase.latencies += lat
            phase.renewed += renewed
            for k, v in errors.items():
                phase.errors[k] = phase.errors.get(k, 0) + v

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + seconds + 0.05
    t0 = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    phase.seconds = time.perf_counter() - t0
    return phase


def wait_ready(port: int, server: Child, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.proc is not None
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited: {server.output()[-3000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/default/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server not ready: {server.output()[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per phase")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--attempts", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2, help="each phase runs this often")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    stop_on_sigterm()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    with bench_env(redis_db=14) as env:
        # Each endpoint beats its own K attempts.
        attempts = {m: launched_attempts(args.attempts) for m in MOUNTS}
        expire_leases(attempts["renew"])
        port = free_port()
        server = start_child("server", [sys.executable, __file__, "--serve", str(port)],
                       {**os.environ, **env}, log_dir)
        try:
            wait_ready(port, server)
            for mount in MOUNTS:  # warm connections, pools and caches
                drive(port, mount, attempts[mount], args.clients, 0.5)
            totals = {m: Phase() for m in MOUNTS}
            order = list(MOUNTS)
            for r in range(args.rounds):
                for mount in (order if r % 2 == 0 else order[::-1]):
                    totals[mount].add(drive(port, mount, attempts[mount], args.clients,
                                            args.seconds))
        finally:
            server.stop()
    shutil.rmtree(log_dir, ignore_errors=True)
    host = urlsplit(f"http://127.0.0.1:{port}").netloc
    print(f"one uvicorn server on {host} (h11, asyncio; same process for all four), "
          f"{args.clients} keep-alive clients, {args.attempts} attempts, "
          f"{args.rounds} x {args.seconds:g} s per row, 2 shared cores")
    print(f"{'endpoint':38} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'ratio':>6} "
          f"{'writes':>7} {'errors':>7}")
    base = totals["bare"].rate
    for mount in MOUNTS:
        p = totals[mount]
        n = len(p.latencies)
        print(f"{LABELS[mount]:38} {p.rate:7.0f} {pct(p.latencies, 50) * 1000:7.2f} "
              f"{pct(p.latencies, 99) * 1000:7.2f} {p.rate / base:6.2f} "
              f"{p.renewed / n:7.1%} {sum(p.errors.values()):7d}")
        if p.errors:
            print(f"  errors: {p.errors}")
    print("ratio: req/s over the bare route's; writes: share of requests that updated a row")
    shared, memory = totals["default"], totals["memory"]
    print(f"budgets in Redis / in memory: {shared.rate / memory.rate:.2f}x req/s, p50 "
          f"{pct(shared.latencies, 50) / pct(memory.latencies, 50):.2f}x, p99 "
          f"{pct(shared.latencies, 99) / pct(memory.latencies, 99):.2f}x")


if __name__ == "__main__":
    main()
