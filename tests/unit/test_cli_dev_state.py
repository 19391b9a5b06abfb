"""How `playrun` commands in another terminal find a running `playrun dev`: its state file
is read only while its process lives, only the stack's own settings are taken, and nothing
is taken over what the environment already says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.cli import dev
from tasks.errors import NoStackError


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    from tasks.broker.app import app

    monkeypatch.setenv("HOME", str(tmp_path))
    before = (app.conf.broker_url, app.conf.result_backend)
    yield tmp_path / ".playrun"
    app.conf.update(broker_url=before[0], result_backend=before[1])


def write_state(home: Path, pid: int, env: dict[str, object]) -> None:
    home.mkdir(parents=True, exist_ok=True)
    dev.state_path().write_text(json.dumps({"pid": pid, "env": env}))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_live_dev_stack_is_used_when_nothing_is_configured(home: Path) -> None:
    write_state(home, os.getpid(), {"PLAYRUN_DATABASE_URL": "sqlite:////tmp/dev.db",
                                    "PLAYRUN_REDIS_URL": "redis://127.0.0.1:1/0",
                                    "PLAYRUN_SECRET_KEY": "not shared", "PATH": "/nowhere"})
    environ = {"PLAYRUN_GATEWAY_URL": "http://mine:1"}
    assert dev.apply_state(environ)
    assert environ == {"PLAYRUN_DATABASE_URL": "sqlite:////tmp/dev.db",
                       "PLAYRUN_REDIS_URL": "redis://127.0.0.1:1/0",
                       "PLAYRUN_GATEWAY_URL": "http://mine:1"}  # its own value is kept


def test_a_configured_database_or_a_gone_stack_is_left_alone(home: Path) -> None:
    write_state(home, os.getpid(), {"PLAYRUN_DATABASE_URL": "sqlite:////tmp/dev.db"})
    configured = {"PLAYRUN_REDIS_URL": "redis://mine"}
    assert not dev.apply_state(configured)
    assert configured == {"PLAYRUN_REDIS_URL": "redis://mine"}
    write_state(home, dead_pid(), {"PLAYRUN_DATABASE_URL": "sqlite:////tmp/dev.db"})
    assert dev.read_state() is None and not dev.apply_state({})
    dev.state_path().write_text("{not json")
    assert dev.read_state() is None
    dev.state_path().unlink()
    assert dev.read_state() is None


def test_without_a_stack_commands_say_how_to_start_one(home: Path) -> None:
    with pytest.raises(NoStackError, match="playrun dev"):
        dev.require_stack({})
    dev.require_stack({"PLAYRUN_DATABASE_URL": "sqlite:////tmp/x.db"})  # configured: fine
    home.mkdir(parents=True, exist_ok=True)
    (home / "playrun.db").write_bytes(b"")
    with pytest.raises(NoStackError):  # an empty file is not a database made on purpose
        dev.require_stack({})
    (home / "playrun.db").write_bytes(b"SQLite format 3\0")
    dev.require_stack({})
