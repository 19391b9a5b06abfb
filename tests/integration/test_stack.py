"""tasks.testing.Stack on this machine's PostgreSQL and Redis: a play submitted through the
public API succeeds, and close() leaves no process, no database and no changed setting."""

from __future__ import annotations

import os
import secrets
import signal
import sys
from pathlib import Path

import psycopg
import pytest

import tasks
from tasks.host.processes import pid_alive
from tasks.testing import Child, Stack
from tests.support.helpers import eventually
from tests.support.paths import ROOT
from tests.support.private_servers import admin_url
from tests.support.session import PG_BASE, TEST_PG_URL, TEST_REDIS_URL, pg_database

pytestmark = pytest.mark.slow

HELLO = ROOT / "examples" / "plays" / "hello.py"


def private_database() -> str:
    """Named like the session's, so a killed session's copy is dropped by the next one."""
    return pg_database(f"playrun_test_{os.getpid()}_stack_{secrets.token_hex(3)}")


def database_exists(url: str) -> bool:
    name = url.rsplit("/", 1)[1].split("?")[0]
    with psycopg.connect(admin_url(PG_BASE), autocommit=True) as conn:
        return (
            conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            is not None
        )


def test_a_stack_on_this_machines_servers_runs_a_play_and_leaves_nothing(tmp_path: Path) -> None:
    url = private_database()
    stack = Stack(database=url, create_database=True, redis=TEST_REDIS_URL, home=tmp_path / "stack")
    with stack:
        assert database_exists(url)
        view = stack.run(HELLO, {"name": "Lin"}, org_id="stack-test")
        assert (view.status, view.output) == (
            "succeeded",
            {"greeting": "Hello, Lin!", "shout": "LIN"},
        )
        # This process's public API is on the stack while it runs.
        assert tasks.get_run(view.id).org_id == "stack-test"
        started = stack.pids()
        roles = {c.name.split("@")[0] for c in stack.children}
        assert roles == {"gateway", "worker0", "beat"}
        assert len(started) > len(roles)  # the worker's pool children are counted too
    assert stack.pids() == []
    # A killed sandbox process may be a zombie for a moment, until its reaper collects it.
    eventually(lambda: [pid for pid in started if pid_alive(pid)] == [],
               what="every process the stack started gone")
    assert not database_exists(url)
    assert os.environ["PLAYRUN_DATABASE_URL"] == TEST_PG_URL  # the session's, back
    assert os.environ["PLAYRUN_REDIS_URL"] == TEST_REDIS_URL


def test_a_worker_that_cannot_start_is_reported_and_nothing_is_left(tmp_path: Path) -> None:
    url = private_database()
    stack = Stack(
        database=url,
        create_database=True,
        redis=TEST_REDIS_URL,
        home=tmp_path / "stack",
        settings={"PLAYRUN_LEASE_SECONDS": "-1"},
    )
    with pytest.raises(tasks.PlayrunError) as caught:
        stack.start()
    assert caught.value.code == "PROCESS_NOT_READY"
    assert "exited" in caught.value.message and str(tmp_path) in caught.value.message
    assert stack.pids() == []
    assert not database_exists(url)
    assert os.environ["PLAYRUN_DATABASE_URL"] == TEST_PG_URL


def test_a_child_is_ready_by_its_log_and_stops_with_its_whole_group(tmp_path: Path) -> None:
    # A shell with a background child of its own: stop() must end both.
    script = "sleep 300 & echo $! > grandchild; echo serving; wait"
    child = Child(
        "sh",
        ["sh", "-c", script],
        dict(os.environ),
        tmp_path / "sh.log",
        cwd=tmp_path,
        ready_text="serving",
    )
    with child:
        grandchild = int((tmp_path / "grandchild").read_text())
        assert pid_alive(grandchild) and child.running
    assert not child.running and not pid_alive(grandchild)
    # Started again it appends to the same log, and readiness reads only the new life.
    child.ready_text = "second"
    with pytest.raises(tasks.PlayrunError, match="not ready"):
        child.start().wait_ready(timeout=0.5)
    child.stop(signal.SIGKILL)
    assert child.output().count("serving") == 2


def test_a_child_that_exits_says_so_with_its_log(tmp_path: Path) -> None:
    child = Child(
        "fails",
        [sys.executable, "-c", "print('no config'); raise SystemExit(3)"],
        dict(os.environ),
        tmp_path / "fails.log",
        ready_text="ready",
    )
    with pytest.raises(tasks.PlayrunError) as caught:
        child.start().wait_ready()
    assert caught.value.code == "PROCESS_NOT_READY"
    assert "code 3" in caught.value.message and "no config" in caught.value.message
