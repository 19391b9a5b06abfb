"""Work receipts on the embedded stack: SQLite, a private valkey-server, a worker and the
gateway as child processes, driven through the CLI as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.testing import Stack
from tests.support.env import clean_env
from tests.support.paths import PLAYS, ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    # Process isolation: the side-effect counter is a file on the host.
    with Stack(home=tmp_path_factory.mktemp("receipts-sqlite"), beat=False, bind=False,
               settings={"PLAYRUN_SANDBOX_ISOLATION": "process"}) as stack:
        yield clean_env(**stack.env)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tasks.cli.main", *args], env={**env,
                          "COLUMNS": "250"}, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=150)


def test_a_step_is_computed_once_and_reused_on_sqlite(stack_env: dict[str, str],
                                                      tmp_path: Path) -> None:
    counter = tmp_path / "calls.txt"
    outputs = []
    for tag in ("first", "second"):
        proc = cli(stack_env, "submit", str(PLAYS / "steps.py"), "--org", "lite", "--wait",
                   "--timeout", "120", "--input",
                   json.dumps({"counter": str(counter), "tag": tag}))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outputs.append(json.loads(proc.stdout)["output"])
    assert outputs == [{"out": {"tag": "first"}}] * 2
    assert counter.read_text().count("\n") == 1
    shown = cli(stack_env, "receipts", "show", "--org", "lite", "--play", "steps")
    assert "lookup:acme.com" in shown.stdout and "completed" in shown.stdout, shown.stdout
    assert "cleared 1 receipt(s)" in cli(stack_env, "receipts", "clear", "--org",
                                         "lite").stdout
