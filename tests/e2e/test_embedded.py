"""The embedded default: a private valkey-server from its wheel, SQLite, real workers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.testing import Stack
from tests.support.helpers import pids_with_env
from tests.support.paths import PLAYS, ROOT

pytestmark = pytest.mark.slow


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYRUN_")}
    env.update(extra)
    return env


def test_playrun_demo_runs_the_sample_play_and_stops_everything(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "tasks.cli.main", "demo"], cwd=str(tmp_path),
                          env=clean_env(HOME=str(tmp_path), COLUMNS="80"),
                          capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # Piped: one whole line per event, its time in UTC with a zone, no status-line residue.
    ledger = [line for line in proc.stdout.splitlines() if line.startswith("  ")]
    kinds = []
    for line in ledger:
        match = re.fullmatch(r"  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ([a-z_.]+)( .*)?", line)
        assert match, line
        kinds.append(match.group(1))
    for kind in ("run.admitted", "attempt.started", "sandbox.live", "run.progress",
                 "run.succeeded", "sandbox.deleted"):
        assert kind in kinds
    admitted = ledger[kinds.index("run.admitted")]
    assert len(admitted) > 80 and re.search(r'play_digest="[0-9a-f]{64}"', admitted)
    assert "\x1b[" not in out and "\r" not in out
    assert 'output {"greeting": "Hello, Ada!", ' in proc.stdout  # JSON, not a Python repr
    assert re.search(r"^isolation (strict|process): ", proc.stdout, re.M), proc.stdout
    assert re.search(r"^metrics   http://127\.0\.0\.1:\d+/metrics  \(worker\)$", proc.stdout,
                     re.M), proc.stdout
    # Everything it started is gone: no celery (pool children included) or valkey left.
    assert pids_with_env("HOME", str(tmp_path)) == []


def test_the_leftover_check_sees_what_a_child_inherits(tmp_path: Path) -> None:
    """The check above is by environment, which a worker's pool children inherit."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env=clean_env(HOME=str(tmp_path)))
    try:
        assert pids_with_env("HOME", str(tmp_path)) == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert pids_with_env("HOME", str(tmp_path)) == []


@pytest.fixture(scope="module")
def sqlite_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with Stack(home=tmp_path_factory.mktemp("embedded"), beat=False, bind=False) as stack:
        yield clean_env(**stack.env)


def submit(env: dict[str, str], play: Path, input: str = "{}") -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-m", "tasks.cli.main", "submit", str(play), "--input", input, "--org",
         "embedded", "--wait", "--timeout", "90"],
        env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    doc: dict[str, object] = json.loads(proc.stdout)
    return doc


def test_cli_submit_wait_on_sqlite(sqlite_stack: dict[str, str]) -> None:
    doc = submit(sqlite_stack, ROOT / "examples" / "plays" / "hello.py", '{"name": "Lin"}')
    assert doc["status"] == "succeeded"
    assert doc["output"] == {"greeting": "Hello, Lin!", "shout": "LIN"}


@pytest.mark.parametrize(("play", "code"), [("raises.py", "PLAY_ERROR"),
                                            ("syntax_error.py", "PLAY_INVALID")])
def test_failures_carry_codes_on_sqlite(sqlite_stack: dict[str, str], play: str,
                                        code: str) -> None:
    doc = submit(sqlite_stack, PLAYS / play)
    assert (doc["status"], doc["code"]) == ("failed", code)


def test_cli_bad_input_is_a_clear_error(sqlite_stack: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tasks.cli.main", "submit", str(PLAYS / "raises.py"), "--input",
         "{not json", "--org", "embedded"],
        env=sqlite_stack, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "INPUT_INVALID" in proc.stderr


def test_cli_show_unknown_run(sqlite_stack: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "tasks.cli.main", "show", "nope"],
                          env=sqlite_stack, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "RUN_NOT_FOUND" in proc.stderr
