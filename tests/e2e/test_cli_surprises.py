"""The CLI as a new user meets it, through the real `python -m tasks.cli.main`: a default input
of `{}`, a hint when no worker answers, a fast coded failure when Redis or the database
does not, a live status line only on a terminal, and `show` as a timeline."""

from __future__ import annotations

import json
import os
import pty
import re
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.constants import CLI_NO_WORKER_HINT_S
from tasks.host.processes import free_port
from tasks.testing import Stack
from tests.support.paths import ROOT

HELLO = ROOT / "examples" / "plays" / "hello.py"
# A zoned ISO 8601 time, as every ledger line starts.
ZONED = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYRUN_")}
    env.update(extra)
    return env


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tasks.cli.main", *args], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess[str], code: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error {code}: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def sqlite_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = clean_env(**{"HOME": str(tmp), "PLAYRUN_DATABASE_URL": f"sqlite:///{tmp / 'playrun.db'}",
                       "PLAYRUN_SANDBOX_ROOT": str(tmp / "sandboxes"), **extra})
    subprocess.run([sys.executable, "-m", "tasks.cli.main", "db", "upgrade"], env=env, check=True,
                   cwd=str(ROOT), capture_output=True)
    return env


@pytest.fixture(scope="module")
def no_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A live Redis and a migrated database, and nobody consuming the queue."""
    home = tmp_path_factory.mktemp("noworker")
    with Stack(home=home, workers=0, beat=False, gateway=False, bind=False) as stack:
        yield sqlite_env(home, PLAYRUN_REDIS_URL=stack.redis_url)


@pytest.fixture(scope="module")
def with_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    home = tmp_path_factory.mktemp("withworker")
    with Stack(home=home, beat=False, bind=False) as stack:
        yield sqlite_env(home, **stack.env)


@pytest.mark.slow
def test_submit_wait_without_input_sends_an_empty_object(with_worker: dict[str, str]) -> None:
    proc = cli(with_worker, "submit", str(HELLO), "--wait", "--timeout", "90", timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["status"], doc["output"]) == (
        "succeeded", {"greeting": "Hello, world!", "shout": "WORLD"})
    shown = cli(with_worker, "show", doc["id"], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["status"] == "succeeded"


@pytest.mark.slow
def test_show_prints_attempts_and_the_ledger_as_a_timeline(with_worker: dict[str, str]) -> None:
    run_id = json.loads(cli(with_worker, "submit", str(HELLO), "--input", '{"name": "Bo"}',
                            "--wait", timeout=120).stdout)["id"]
    proc = cli(with_worker, "show", run_id, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"run {run_id}  org default  play ")
    assert re.search(rf"status succeeded  created {ZONED}  finished {ZONED} \(", lines[1])
    attempts = lines.index("attempts")
    assert re.fullmatch(rf"  #1 ended  sandbox lsb-\w+  started {ZONED}  ended {ZONED} .*",
                        lines[attempts + 1])
    ledger = lines[lines.index("ledger") + 1:]
    kinds = [re.fullmatch(rf" +[+-]\d+\.\d{{3}}s {ZONED} (\S+).*", line).group(1)  # type: ignore[union-attr]
             for line in ledger]
    assert kinds[:2] == ["run.admitted", "attempt.started"] and "run.succeeded" in kinds
    assert 'message="letter" fields={"index": 1, "letter": "o"}' in proc.stdout


def test_submit_wait_with_no_worker_says_so_and_keeps_waiting(no_worker: dict[str, str]) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tasks.cli.main", "submit", str(HELLO), "--wait",
                             "--timeout", str(CLI_NO_WORKER_HINT_S + 15)],
                            env=no_worker, cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        began = time.monotonic()
        assert proc.stderr is not None
        hint = proc.stderr.readline()
        hinted_after = time.monotonic() - began
        assert "no worker has started run" in hint and "celery -A tasks worker" in hint, hint
        assert no_worker["PLAYRUN_REDIS_URL"] in hint
        # Well before the wait's own timeout (the CLI's start-up is slow on a loaded machine).
        assert hinted_after < CLI_NO_WORKER_HINT_S + 15, hinted_after
        assert proc.poll() is None  # the hint does not end the wait
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2
    assert err.strip().startswith("error WAIT_TIMEOUT: run ") and "still queued" in err
    assert "no worker" not in err  # said once


def test_the_status_line_shows_on_a_terminal_only(no_worker: dict[str, str]) -> None:
    args = [sys.executable, "-m", "tasks.cli.main", "submit", str(HELLO), "--wait",
            "--timeout", "2"]
    piped = subprocess.run(args, env=no_worker, cwd=str(ROOT), capture_output=True, text=True,
                           timeout=60)
    assert "\x1b[" not in piped.stderr and "events," not in piped.stderr
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(args, env={**no_worker, "TERM": "xterm", "COLUMNS": "120"},
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=secondary)
    os.close(secondary)
    shown = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    proc.wait(timeout=30)
    os.close(primary)
    text = shown.decode(errors="replace")
    assert re.search(r"run [0-9a-f]{32}: run\.admitted \(1 events, \d+ s\)", text), text
    assert "error WAIT_TIMEOUT" in text


def test_redis_down_fails_fast_and_leaves_the_run_for_the_sweep(tmp_path: Path) -> None:
    env = sqlite_env(tmp_path, PLAYRUN_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    began = time.monotonic()
    proc = cli(env, "submit", str(HELLO))
    took = time.monotonic() - began
    line = one_error_line(proc, "BROKER_UNAVAILABLE")
    assert took < 10, took
    assert "must be restarted" not in proc.stdout + proc.stderr
    run_id = re.search(r"run ([0-9a-f]{32}) is committed", line).group(1)  # type: ignore[union-attr]
    assert "outbox sweep" in line
    with sqlite3.connect(tmp_path / "playrun.db") as db:
        status, = db.execute("select status from runs where id = ?", (run_id,)).fetchone()
        sent, = db.execute("select sent_at from outbox where run_id = ?", (run_id,)).fetchone()
    assert (status, sent) == ("queued", None)  # committed, unsent: the sweep's to publish


def test_a_redis_that_accepts_but_never_answers_is_bounded_too(tmp_path: Path) -> None:
    """A wedged or firewalled Redis: the connect works, no reply ever comes."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        env = sqlite_env(tmp_path, PLAYRUN_REDIS_URL=f"redis://127.0.0.1:"
                                                     f"{silent.getsockname()[1]}/0")
        began = time.monotonic()
        proc = cli(env, "submit", str(HELLO))
        took = time.monotonic() - began
    one_error_line(proc, "BROKER_UNAVAILABLE")
    assert took < 20, took


@pytest.mark.parametrize("url", ["postgresql+psycopg://nobody:secret@127.0.0.1:{port}/x",
                                 "sqlite:////dev/null/{port}/playrun.db"])
@pytest.mark.parametrize("args", [["runs"], ["show", "0" * 32], ["submit", str(HELLO)]])
def test_an_unreachable_database_is_one_coded_line(url: str, args: list[str]) -> None:
    env = clean_env(PLAYRUN_DATABASE_URL=url.format(port=free_port()))
    line = one_error_line(cli(env, *args), "DATABASE_UNAVAILABLE")
    assert "secret" not in line  # the password is not printed


@pytest.mark.parametrize(("args", "code"), [
    (["submit", str(HELLO), "--input", "{not json"], "INPUT_INVALID"),
    (["submit", str(HELLO), "--input", "[1, 2"], "INPUT_INVALID"),
    (["show", "f" * 32], "RUN_NOT_FOUND"),
    (["cancel", "f" * 32], "RUN_NOT_FOUND"),
    (["submit", str(ROOT / "no-such-play.py")], "PLAY_NOT_FOUND"),
])
def test_bad_requests_are_one_coded_line(tmp_path: Path, args: list[str], code: str) -> None:
    env = sqlite_env(tmp_path, PLAYRUN_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    one_error_line(cli(env, *args), code)


def test_a_key_reused_with_another_input_is_one_coded_line(no_worker: dict[str, str]) -> None:
    key = f"k-{os.getpid()}-{time.monotonic_ns()}"
    first = cli(no_worker, "submit", str(HELLO), "--key", key, "--input", '{"name": "A"}')
    assert first.returncode == 0, first.stderr
    run_id = first.stdout.strip()
    same = cli(no_worker, "submit", str(HELLO), "--key", key, "--input", '{"name": "A"}')
    assert same.stdout.strip() == run_id
    line = one_error_line(cli(no_worker, "submit", str(HELLO), "--key", key, "--input",
                              '{"name": "B"}'), "IDEMPOTENCY_CONFLICT")
    assert run_id in line
