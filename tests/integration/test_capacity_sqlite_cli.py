"""Capacity on the embedded SQLite path (concurrent reservations never pass the limit),
and the `playrun capacity` commands."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid

import sqlalchemy as sa

from models import CapacityLease
from tasks.acquisition import capacity
from tasks.acquisition.claim import Claimed, claim
from tasks.admission.submit import admit
from tasks.errors import CapacityExceededError
from tasks.settings import get_settings
from tasks.store import db
from tasks.store.fence import hold
from tests.support.paths import ROOT
from tests.support.stack import worker_env


def test_concurrent_reservations_on_sqlite_never_pass_the_limit(sqlite_db: str) -> None:
    org, limit, clients = "embedded-org", 3, 12
    capacity.set_limit(org, limit)
    fences = []
    for _ in range(clients):
        run_id = admit(ROOT / "examples" / "plays" / "noop.py", {}, org, None).run_id
        with db.session_scope() as s:
            c = claim(s, run_id, worker_id="t", lease_seconds=60)
        assert isinstance(c, Claimed)
        fences.append(c.fence)
    results: list[str] = []
    start = threading.Barrier(clients)

    def client(i: int) -> None:
        start.wait()
        try:
            with db.session_scope() as s:
                hold(s, fences[i])
                capacity.reserve(s, fences[i], org, get_settings())
            results.append("ok")
        except CapacityExceededError:
            results.append("full")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with db.session_scope(readonly=True) as s:
        held = s.scalar(sa.select(sa.func.count()).where(
            CapacityLease.org_id == org, CapacityLease.state.in_(capacity.HELD)))
    assert results.count("ok") == limit == held
    assert results.count("full") == clients - limit


def test_capacity_cli_set_and_show(pg_url: str) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tasks.cli.main", "capacity", *args],
                              env={**worker_env(), "COLUMNS": "200"}, cwd=str(ROOT),
                              capture_output=True, text=True, timeout=60)

    shown = cli("set", org, "7")
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if org in line)
    assert "7" in row.split()
    assert "default limit" in cli("show").stdout
    assert cli("set", org, "-1").returncode == 2  # a clear usage error, nothing changed
    assert cli("unset", org).returncode == 0  # back to the default
    with db.session_scope(readonly=True) as s:
        assert capacity.limit_for(s, org, default=10) == 10
