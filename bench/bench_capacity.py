"""Capacity leases: reserve + promote + release cycles per second on PostgreSQL, side by
side with a bare single-row UPDATE loop on the same database.

    python bench/bench_capacity.py [--seconds 3] [--clients 1,8]

One cycle is what a sandbox start and its release cost the capacity ledger, each step one
statement that checks the attempt's fence itself, here each its own (autocommit)
transaction: reserve (lock the org row, count held leases, insert a reservation), promote
(compare-and-set to `live`), release (records `capacity.released` in the run ledger).
Each client is its own process (spawned, own engine) holding one claimed attempt.

Rows:  N clients, one org   every client reserves from the same org (they serialise on
                            its row lock); the baseline UPDATEs one shared row.
       N clients, N orgs    one org per client; the baseline UPDATEs one row per client.
The database is created and migrated (Alembic) for the run and dropped at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import PG_BASE, capacity_cycle  # noqa: E402

NOOP = ROOT / "examples" / "plays" / "noop.py"
SPAWN = mp.get_context("spawn")


def _point_at(url: str) -> None:
    os.environ["PLAYRUN_DATABASE_URL"] = url
    from tasks.settings import reset_settings

    reset_settings()


def _setup_client(url: str, org_id: str) -> tuple[str, int, str]:
    """A run and a claimed attempt (long lease) for one client; returns its fence."""
    _point_at(url)
    from tasks.acquisition.claim import Claimed, claim
    from tasks.admission.submit import admit
    from tasks.store.db import session_scope

    run_id = admit(NOOP, {}, org_id, None).run_id
    with session_scope() as session:
        claimed = claim(session, run_id, worker_id="bench", lease_seconds=3600)
    assert isinstance(claimed, Claimed)
    f = claimed.fence
    return f.run_id, f.generation, f.lease_token


def _cycles(url: str, fence_t: tuple[str, int, str], org_id: str, seconds: float,
            barrier: Any, out: Any) -> None:
    _point_at(url)
    from tasks.settings import get_settings
    from tasks.store.fence import Fence

    fence, settings = Fence(*fence_t), get_settings()

    def cycle(i: int) -> None:
        capacity_cycle(fence, org_id, settings, f"sb-{i}")

    for i in range(20):  # warm the pool and the statement cache
        cycle(i)
    barrier.wait()
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        cycle(n)
        n += 1
    out.put(n)


def _updates(url: str, org_id: str, seconds: float, barrier: Any, out: Any) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    stmt = sa.text("UPDATE capacity_orgs SET updated_at = clock_timestamp() WHERE org_id = :o")
    with engine.connect() as conn:
        for _ in range(20):
            conn.execute(stmt, {"o": org_id})
            conn.commit()
        barrier.wait()
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            conn.execute(stmt, {"o": org_id})
            conn.commit()  # one transaction per UPDATE, like one per capacity step
            n += 1
    engine.dispose()
    out.put(n)


def _race(target: Any, per_client: list[tuple[Any, ...]], seconds: float) -> float:
    barrier = SPAWN.Barrier(len(per_client))
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=target, args=(*args, seconds, barrier, out))
             for args in per_client]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        if p.exitcode != 0:
            raise RuntimeError(f"a client exited with {p.exitcode}")
    return total / seconds


def measure(url: str, clients: int, shared_org: bool, seconds: float) -> tuple[float, float]:
    from tasks.acquisition import capacity

    tag = secrets.token_hex(3)
    orgs = [f"bench-{tag}" if shared_org else f"bench-{tag}-{i}" for i in range(clients)]
    for o in set(orgs):
        capacity.set_limit(o, clients)  # never full: measure the cost, not rejections
    fences = [_setup_client(url, o) for o in orgs]
    leases = _race(_cycles, [(url, f, o) for f, o in zip(fences, orgs, strict=True)], seconds)
    updates = _race(_updates, [(url, o) for o in orgs], seconds)
    return leases, updates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default="1,8")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]

    import psycopg

    name = f"playrun_bench_cap_{secrets.token_hex(4)}"
    admin = PG_BASE.replace("+psycopg", "") + "/postgres"
    url = f"{PG_BASE}/{name}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        _point_at(url)
        from tasks.store import db

        db.upgrade(url)
        rows = []
        for n in counts:
            rows.append((f"{n} client{'s' if n > 1 else ''}, one org", *measure(url, n, True,
                                                                              args.seconds)))
            if n > 1:
                rows.append((f"{n} clients, {n} orgs", *measure(url, n, False, args.seconds)))
        with psycopg.connect(url.replace("+psycopg", "")) as conn:
            held = conn.execute("SELECT count(*) FROM capacity_leases "
                                "WHERE state IN ('reserved', 'live')").fetchone()
            server = conn.execute("SHOW server_version").fetchone()
        assert held is not None and held[0] == 0, f"{held} leases left held"
        print(f"PostgreSQL {server[0] if server else '?'}, {args.seconds:g} s per measurement, "
              "one process per client")
        print(f"{'':24} {'capacity cycles/s':>18} {'bare UPDATE/s':>14} {'ratio':>7}"
              f" {'ms/cycle':>9}")
        for label, leases, updates in rows:
            clients = int(label.split()[0])
            print(f"{label:24} {leases:18.0f} {updates:14.0f} {leases / updates:7.3f}"
                  f" {1000 * clients / leases:9.2f}")
        print("a cycle = reserve (fenced, org row lock, count, insert) + promote (fenced CAS)"
              " + release (ledger event): 3 statements, 3 transactions")
    finally:
        from tasks.store import db

        db.dispose_engines()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
