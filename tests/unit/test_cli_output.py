"""What `playrun` prints, at 80 columns and piped: tables that fit without breaking a word,
tab-separated rows on a pipe, `Z` times, one coded line when no stack runs or a port is
taken, help without `<bool>`, and a play's traceback with the play's own frames only."""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from rich.console import Console
from typer.testing import CliRunner

from models import Run
from tasks.admission.submit import admit
from tasks.cli import banner
from tasks.cli.main import app
from tasks.cli.records import receipt_table
from tasks.cli.runs import table as runs_table
from tasks.cli.tables import SHORT_ID, show
from tasks.store.db import session_scope
from tasks.testing import Stack
from tests.support.paths import ROOT

HELLO = ROOT / "examples" / "plays" / "hello.py"
ZONED = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
runner = CliRunner()


def terminal(width: int = 80) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=width, color_system=None), buf


def run_view(i: int, **extra: object) -> SimpleNamespace:
    now = datetime.now(UTC)  # read when the test runs: "5m ago" is relative to it
    base: dict[str, object] = {
        "id": f"{i:x}" * 32, "org_id": "default", "status": "succeeded", "code": None,
        "created_at": now - timedelta(minutes=5), "finished_at": now - timedelta(minutes=4)}
    return SimpleNamespace(**{**base, **extra})


def test_runs_fit_80_columns_without_breaking_a_word() -> None:
    views = [run_view(1), run_view(2, status="failed", code="PLAY_ERROR",
                                   org_id="an-org-with-a-long-name-" * 3)]
    out, buf = terminal()
    show(out, runs_table(views))
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80, lines
    assert lines[0].split() == ["id", "status", "code", "org", "created", "took"]
    assert lines[1].split()[:2] == ["1" * SHORT_ID, "succeeded"]
    assert lines[2].split()[:3] == ["2" * SHORT_ID, "failed", "PLAY_ERROR"]
    assert "5m ago" in lines[1] and "an-org-with-a-" in lines[2] and "…" in lines[2]


def test_runs_at_50_columns_drop_columns_instead_of_wrapping() -> None:
    out, buf = terminal(50)
    show(out, runs_table([run_view(3, status="cancelled", code="CANCELLED")]))
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and max(map(len, lines)) <= 50, lines
    assert lines[1].split()[:2] == ["3" * SHORT_ID, "cancelled"]


def test_receipts_fit_80_columns_and_keep_every_status_whole() -> None:
    now = datetime.now(UTC)
    receipt = SimpleNamespace(
        play="steps", key="lookup:acme.com", org_id="o", status="completed",
        output={"domain": "acme.com", "employees": 1200, "notes": "x" * 80}, run_id="a" * 32,
        generation=1, created_at=now - timedelta(hours=3), completed_at=now,
        expires_at=now + timedelta(days=2, hours=1), code=None, error=None)
    out, buf = terminal()
    show(out, receipt_table([receipt], one_play=False))
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= 80, lines
    assert "completed" in lines[1].split() and "aaaaaaaaaaaa/1" in lines[1]
    assert "comple…" not in buf.getvalue()


def test_piped_runs_are_tab_separated_with_whole_ids_and_z_times(sqlite_db: str) -> None:
    ids = [admit(HELLO, {}, "pipe-org", None).run_id for _ in range(3)]
    listed = runner.invoke(app, ["runs", "--limit", "2"])
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0] == "id\tstatus\tcode\torg\tcreated\ttook"
    rows = [line.split("\t") for line in lines[1:]]
    assert [r[0] for r in rows] == ids[::-1][:2]
    assert all(r[1] == "queued" and r[3] == "pipe-org" and re.fullmatch(ZONED, r[4])
               for r in rows)
    assert "more: --before " in listed.stderr  # the cursor is not a row
    doc = runner.invoke(app, ["runs", "--json"]).stdout
    assert re.search(rf'"created_at": "{ZONED}"', doc) and "+00:00" not in doc
    shown = runner.invoke(app, ["show", ids[0], "--json"]).stdout
    assert re.search(rf'"created_at": "{ZONED}"', shown) and "+00:00" not in shown


def test_show_no_events_prints_no_ledger_header(sqlite_db: str) -> None:
    run_id = admit(HELLO, {}, "default", None).run_id
    full = runner.invoke(app, ["show", run_id]).stdout.splitlines()
    bare = runner.invoke(app, ["show", run_id, "--no-events"]).stdout.splitlines()
    assert "ledger" in full and "ledger" not in bare
    assert bare == full[:full.index("ledger")]


RECORDED = """ValueError: no such company
Traceback (most recent call last):
  File "/srv/sandboxes/lsb-1/runner_steps.py", line 150, in step
    return fn()
           ^^^^
  File "/srv/sandboxes/lsb-1/play.py", line 12, in run
    return ctx.step("lookup", lambda: enrich(name))
  File "/srv/sandboxes/lsb-1/play.py", line 7, in enrich
    raise ValueError("no such company")
  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads
    return _default_decoder.decode(s)"""


def test_show_prints_the_plays_frames_on_their_lines_with_its_file(sqlite_db: str) -> None:
    run_id = admit(HELLO, {}, "default", None).run_id
    with session_scope() as s:
        s.execute(sa.update(Run).where(Run.id == run_id).values(
            status="failed", code="PLAY_ERROR", error=RECORDED))
    lines = runner.invoke(app, ["show", run_id, "--no-events"]).stdout.splitlines()
    at = lines.index("  error ValueError: no such company")
    assert lines[at + 1:at + 5] == [
        f'      File "{HELLO}", line 12, in run',
        '        return ctx.step("lookup", lambda: enrich(name))',
        f'      File "{HELLO}", line 7, in enrich',
        '        raise ValueError("no such company")']
    assert lines[at + 5] == "attempts: none yet"  # no runner or stdlib frames
    assert "runner_steps.py" not in "\n".join(lines) and "play.py" not in "\n".join(lines)


def test_sheet_show_of_a_missing_sheet_is_one_coded_line(sqlite_db: str) -> None:
    result = runner.invoke(app, ["sheet", "show", "nope", "--org", "o", "--play", "p"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error SHEET_NOT_FOUND: no sheet 'nope' for org 'o' and " \
                                    "play 'p'"


def test_submit_of_a_directory_says_it_is_one(sqlite_db: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["submit", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error PLAY_INVALID: {tmp_path} is a directory; submit "
                                     f"takes a play's .py file")


@pytest.mark.parametrize("args", [["runs", "--help"], ["submit", "--help"],
                                  ["db", "current", "--help"], ["policy", "show", "--help"],
                                  ["policy", "normal", "--help"], ["capacity", "show", "--help"]])
def test_help_describes_every_command_and_shows_no_bool(args: list[str]) -> None:
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout and "{play}" not in result.stdout
    description = result.stdout.split("Usage:", 1)[1].splitlines()[2].strip()
    assert description and not description.startswith("╭"), result.stdout


def test_submit_help_names_its_argument_and_describes_input_and_wait() -> None:
    text = runner.invoke(app, ["submit", "--help"], env={"COLUMNS": "100"},
                         prog_name="playrun").stdout
    assert re.search(r"Usage: playrun submit \[OPTIONS\] PLAY *$", text, re.M), text
    assert re.search(r"--input +JSON +the play's input", text), text
    assert re.search(r"--wait +--no-wait +wait for the result", text), text


def user_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYRUN_")}
    return {**env, "HOME": str(home)}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tasks.cli.main", *args], env=env,
                          cwd=str(ROOT), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [["runs"], ["show", "abc"]])
def test_without_a_stack_it_says_how_to_start_one_and_creates_nothing(
        tmp_path: Path, args: list[str]) -> None:
    proc = cli(user_env(tmp_path), *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error NO_STACK: no playrun stack is configured or running: start one with "
        "`playrun dev` (in another terminal), or set PLAYRUN_DATABASE_URL (and "
        "PLAYRUN_REDIS_URL) to yours"]
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(("command", "setting"), [("gateway", "PLAYRUN_GATEWAY_URL"),
                                                  ("dashboard", "PLAYRUN_DASHBOARD_ADDR")])
def test_a_taken_port_is_one_coded_line(tmp_path: Path, taken_port: int, command: str,
                                        setting: str) -> None:
    value = f"http://127.0.0.1:{taken_port}" if command == "gateway" else \
        f"127.0.0.1:{taken_port}"
    env = {**user_env(tmp_path), setting: value,
           "PLAYRUN_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"}
    proc = cli(env, command)
    assert proc.returncode == 2 and "ready" not in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"error ADDRESS_IN_USE: the {command} cannot listen on 127.0.0.1:{taken_port}: another "
        f"process uses that port (stop it, or choose another address with {setting})"]


def test_a_stack_banner_lists_every_metrics_url_and_the_isolation_mode(
        tmp_path: Path) -> None:
    stack = Stack(home=tmp_path)
    env = stack.env
    # Port 0 everywhere: each process picks a free port and writes its URL, never 9464-9466.
    assert {env[f"PLAYRUN_METRICS_{k}_ADDR"] for k in ("WORKER", "BEAT", "GATEWAY")} == {
        "127.0.0.1:0"}
    folder = Path(env["PLAYRUN_METRICS_DIR"])
    folder.mkdir(parents=True)
    for port, kind in enumerate(("worker", "beat", "gateway"), start=41001):
        (folder / f"{kind}-{port}.url").write_text(f"http://127.0.0.1:{port}/metrics\n")
    rows = banner.rows(stack)
    shown = [value for _, value in rows]
    for port, kind in enumerate(("worker", "beat", "gateway"), start=41001):
        assert f"http://127.0.0.1:{port}/metrics  ({kind})" in shown
    isolation = [value for label, value in rows if label == "isolation"]
    assert re.match(r"(strict|process): ", isolation[0]), rows
