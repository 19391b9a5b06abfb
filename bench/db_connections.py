"""PostgreSQL connections a fleet opens, counted in pg_stat_activity, against the formula
of docs/operations.md "Connections".

    python bench/db_connections.py [--shape WxC:N ...] [--runs 40] [--pgbouncer]

Each shape starts W worker hosts of C pool children each, a gateway of N processes, one
standalone beat and the dashboard on a scratch database; every kind of process names
itself in `application_name`. It counts each kind's connections once the fleet is idle,
then samples every 20 ms while --runs plays run at once (hello.py, submitted from this
process) and the dashboard's pages are read, and prints the peak beside the formula's
bound. With --pgbouncer every process connects through a pgbouncer in transaction mode
(tests/support/pgbouncer.py): the clients are counted in its SHOW CLIENTS, PostgreSQL's
connections in pg_stat_activity.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import (
    PG_BASE,
    ROOT,
    bench_env,
    database_name,
    gateway_env,
    start_beat,
    start_child,
    start_gateway,
    start_worker,
    stop_on_sigterm,
)
from tasks.host.processes import free_port
from tasks.testing import Child

HELLO = ROOT / "examples" / "plays" / "hello.py"
KINDS = ("worker", "gateway", "beat", "dashboard", "app")
FAST = {"PLAYRUN_START_RATE_INITIAL_PER_MIN": "6000", "PLAYRUN_START_RATE_MAX_PER_MIN": "12000",
        "PLAYRUN_SANDBOX_ISOLATION": "process", "PLAYRUN_START_ORDER": "fifo"}


def per_process_max() -> int:
    from tasks.settings import get_settings

    s = get_settings()
    return 2 * (s.db_pool_size + s.db_max_overflow)


def bound(w: int, c: int, n: int) -> dict[str, int]:
    """docs/operations.md's bound: a worker process (a host's main process and each of its
    C children) and beat run one thread that uses the database, so at most one connection
    of each pool; the gateway's and the dashboard's request threads may fill both pools.
    A gateway of N > 1 processes has a supervisor that opens none."""
    each = per_process_max()
    return {"worker": w * (c + 1) * 2, "gateway": n * each, "beat": 2, "dashboard": each}


def ceiling(w: int, c: int, n: int) -> int:
    """Every pool of every process full."""
    return (w * (c + 1) + n + 2) * per_process_max()


def with_name(url: str, kind: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name=playrun-{kind}"


def counts(admin: str, datname: str) -> Counter[str]:
    with psycopg.connect(admin, autocommit=True) as conn:
        rows = conn.execute("SELECT application_name, count(*) FROM pg_stat_activity "
                            "WHERE datname = %s GROUP BY 1", (datname,)).fetchall()
    return Counter({str(name).removeprefix("playrun-"): int(n) for name, n in rows})


def bouncer_clients(bouncer: Any, datname: str) -> Counter[str]:
    return Counter(str(c["application_name"]).removeprefix("playrun-")
                   for c in bouncer.show("CLIENTS") if c["database"] == datname)


def dashboard_reads(url: str, token: str, stop: threading.Event) -> None:
    request = urllib.request.Request(url + "/runs", headers={"Authorization": f"Bearer {token}"})
    while not stop.is_set():
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                reply.read()
        except OSError:
            pass
        stop.wait(0.2)


def measure(w: int, c: int, n: int, runs: int, bouncer_base: Any) -> dict[str, Any]:
    import tasks
    from tasks.settings import reset_settings
    from tasks.store import db

    log_dir = Path(tempfile.mkdtemp(prefix="playrun-bench-conns-"))
    children: list[Child] = []
    with bench_env(14) as env:
        datname = database_name(env)
        direct = env["PLAYRUN_DATABASE_URL"]
        bouncer = bouncer_base(PG_BASE) if bouncer_base else None
        url = bouncer.url(datname) if bouncer else direct
        extra = {"PLAYRUN_DB_PGBOUNCER": "true"} if bouncer else {}
        base = {**os.environ, **env, **FAST, **extra, **gateway_env(log_dir)}
        os.environ.update({**FAST, **extra, "PLAYRUN_GATEWAY_URL": base["PLAYRUN_GATEWAY_URL"],
                           "PLAYRUN_DATABASE_URL": with_name(url, "app")})
        reset_settings()
        db.dispose_engines()

        def role(kind: str) -> dict[str, str]:
            return {**base, "PLAYRUN_DATABASE_URL": with_name(url, kind)}

        token = secrets.token_hex(16)
        dash_port = free_port()
        stop = threading.Event()
        try:
            children.append(start_gateway({**role("gateway"),
                                           "PLAYRUN_GATEWAY_WORKERS": str(n)}, log_dir))
            children.append(start_beat(role("beat"), log_dir))
            dash = start_child("dashboard", [sys.executable, "-m", "tasks.cli.main",
                                             "dashboard"],
                               {**role("dashboard"), "PLAYRUN_DASHBOARD_TOKEN": token,
                                "PLAYRUN_DASHBOARD_ADDR": f"127.0.0.1:{dash_port}"}, log_dir)
            children.append(dash)
            for i in range(w):
                children.append(start_worker(role("worker"), log_dir, f"w{i}", concurrency=c))
            admin = PG_BASE.replace("+psycopg", "") + "/postgres"
            time.sleep(3)  # what each process opens at start-up, settled
            idle = counts(admin, datname)
            peak: Counter[str] = Counter()
            peak_clients: Counter[str] = Counter()

            def sample() -> None:
                while not stop.is_set():
                    now = counts(admin, datname)
                    now["all"] = sum(now.values())
                    peak.update({k: v - peak[k] for k, v in now.items() if v > peak[k]})
                    if bouncer:
                        now = bouncer_clients(bouncer, datname)
                        now["all"] = sum(now.values())
                        peak_clients.update({k: v - peak_clients[k] for k, v in now.items()
                                             if v > peak_clients[k]})
                    stop.wait(0.02)

            threads = [threading.Thread(target=sample),
                       threading.Thread(target=dashboard_reads,
                                        args=(f"http://127.0.0.1:{dash_port}", token, stop))]
            for thread in threads:
                thread.start()
            started = time.monotonic()
            handles = [tasks.submit_run(HELLO, input={"name": str(i)}, org_id=f"o{i % 8}")
                       for i in range(runs)]
            done = [h.wait(timeout=300).status for h in handles]
            elapsed = time.monotonic() - started
            time.sleep(2)  # releases after the last terminal
            stop.set()
            for thread in threads:
                thread.join()
            return {"shape": f"{w}x{c}:{n}", "idle": idle, "peak": peak,
                    "clients": peak_clients, "bound": bound(w, c, n),
                    "ceiling": ceiling(w, c, n),
                    "succeeded": sum(s == "succeeded" for s in done), "runs": runs,
                    "seconds": round(elapsed, 1)}
        finally:
            stop.set()
            for child in reversed(children):
                child.stop()
            db.dispose_engines()
            if bouncer:
                bouncer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", default=None,
                        help="WxC:N worker hosts x children : gateway processes")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--pgbouncer", action="store_true")
    args = parser.parse_args()
    stop_on_sigterm()
    bouncer_base = None
    if args.pgbouncer:
        from tests.support.pgbouncer import PgBouncer

        bouncer_base = PgBouncer
    print("| shape W x C : N | kind | idle | peak | clients (pgbouncer) | bound |")
    print("| --- | --- | --- | --- | --- | --- |")
    for shape in args.shape or ["1x2:1", "1x4:2", "2x4:2"]:
        hosts, rest = shape.split("x")
        kids, procs = rest.split(":")
        r = measure(int(hosts), int(kids), int(procs), args.runs, bouncer_base)
        for kind in KINDS:
            # Behind PgBouncer a server connection carries whichever client's name it
            # served last: only PostgreSQL's total means something there.
            shown = "-" if args.pgbouncer else r["peak"][kind]
            print(f"| {r['shape']} | {kind} | {'-' if args.pgbouncer else r['idle'][kind]} | "
                  f"{shown} | {r['clients'][kind] if args.pgbouncer else '-'} | "
                  f"{r['bound'].get(kind, '-')} |")
        print(f"| {r['shape']} | all, at once | {sum(r['idle'].values())} | "
              f"{r['peak']['all']} | {r['clients']['all'] if args.pgbouncer else '-'} | "
              f"{sum(r['bound'].values())} (pools full: {r['ceiling']}) |")
        print(f"<!-- {r['shape']}: {r['succeeded']}/{r['runs']} succeeded in "
              f"{r['seconds']} s -->", flush=True)


if __name__ == "__main__":
    main()
