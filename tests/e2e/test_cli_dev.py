"""`playrun dev`: the embedded stack in the foreground; submit, runs and show from another
process find it with nothing exported; Ctrl-C stops every process it started."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.cli.dev import pgdata_dir
from tests.support.helpers import eventually, pids_with_env
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

HELLO = ROOT / "examples" / "plays" / "hello.py"


def user_env(home: Path) -> dict[str, str]:
    """A user's shell: no PLAYRUN_* at all, their own HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYRUN_")}
    env["HOME"] = str(home)
    return env


def playrun(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tasks.cli.main", *args], env=user_env(home),
                          cwd=str(home), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_dev_serves_submit_runs_and_show_from_another_terminal(tmp_path: Path,
                                                               database: str) -> None:
    log = tmp_path / "dev.out"
    args = ["dev", "--postgres"] if database == "postgres" else ["dev"]
    with open(log, "wb") as out:
        dev = subprocess.Popen([sys.executable, "-m", "tasks.cli.main", *args],
                               env=user_env(tmp_path), cwd=str(ROOT), stdout=out,
                               stderr=subprocess.STDOUT)
    try:
        eventually(lambda: b"playrun dev is up" in log.read_bytes() or dev.poll() is not None,
                   timeout=90, what="playrun dev to start")
        assert dev.poll() is None, log.read_text()
        state = json.loads((tmp_path / ".playrun" / "dev.json").read_text())
        assert state["pid"] == dev.pid
        scheme = {"sqlite": "sqlite:///", "postgres": "postgresql+psycopg://"}[database]
        assert state["env"]["PLAYRUN_DATABASE_URL"].startswith(scheme)
        # The export lines follow the "is up" line: wait for the last of them.
        export = f"export PLAYRUN_REDIS_URL={state['env']['PLAYRUN_REDIS_URL']}"
        eventually(lambda: export in log.read_text(), what="the export lines")

        submitted = playrun(tmp_path, "submit", str(HELLO), "--input", '{"name": "Dev"}',
                            "--wait", "--timeout", "90")
        assert submitted.returncode == 0, submitted.stderr
        doc = json.loads(submitted.stdout)
        assert doc["output"] == {"greeting": "Hello, Dev!", "shout": "DEV"}
        listed = json.loads(playrun(tmp_path, "runs", "--json").stdout)["runs"]
        assert [(r["id"], r["status"]) for r in listed] == [(doc["id"], "succeeded")]
        assert doc["id"] in playrun(tmp_path, "runs").stdout  # the table never cuts an id
        shown = playrun(tmp_path, "show", doc["id"])
        assert shown.returncode == 0 and "run.succeeded" in shown.stdout, shown.stderr
        # A second dev on the same home is refused, not started beside the first.
        again = playrun(tmp_path, "dev")
        assert again.returncode == 2 and f"already runs (pid {dev.pid})" in again.stderr
        assert pids_with_env("HOME", str(tmp_path)) != []  # what the check below looks for
    finally:
        dev.send_signal(signal.SIGINT)  # Ctrl-C
        code = dev.wait(timeout=60)
    assert code == 0, log.read_text()
    assert "stopping the dev stack" in log.read_text()
    assert not (tmp_path / ".playrun" / "dev.json").exists()
    assert pids_with_env("HOME", str(tmp_path)) == []  # PostgreSQL too, with --postgres
    shutil.rmtree(pgdata_dir(tmp_path / ".playrun" / "dev").parent, ignore_errors=True)
    # With dev gone the CLI no longer points at it: its default database knows no such run.
    gone = playrun(tmp_path, "show", doc["id"])
    assert gone.returncode == 2 and gone.stderr.startswith("error "), gone.stderr
