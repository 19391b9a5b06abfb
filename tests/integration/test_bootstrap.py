"""The boot script that starts and watches the runner in a remote sandbox, run for real
in a directory standing in for the sandbox's workdir."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.sandbox import ExitReport, ProviderError, SandboxSpec
from tasks.sandbox import supervisor_report as report_mod
from tasks.sandbox.providers import bootstrap, playrun_boot
from tests.support.exit_gateway import PROBE, StubGateway
from tests.support.helpers import eventually


def workdir(tmp_path: Path) -> Path:
    for name, data in bootstrap.files_for(SandboxSpec(labels={}, files={"a.txt": b"A"})).items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def sh(command: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(["sh", "-c", command.replace("python3", sys.executable)],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return done.stdout


def status(wd: Path) -> str:
    return bootstrap.parse_status(sh(bootstrap.status_command(str(wd)))).state


def wait_state(wd: Path, *states: str) -> str:
    deadline = time.monotonic() + 20
    while (state := status(wd)) not in states and time.monotonic() < deadline:
        time.sleep(0.02)
    return state


def test_a_missing_workdir_has_never_started(tmp_path: Path) -> None:
    assert status(tmp_path / "nothing-here") == "never_started"
    assert status(workdir(tmp_path)) == "never_started"


def test_start_returns_at_once_and_records_the_exit(tmp_path: Path) -> None:
    wd = workdir(tmp_path)
    code = ("import os,time; time.sleep(0.3); "
            "open('out.txt','w').write(os.environ['A'] + os.environ['B'] + open('a.txt').read());"
            " raise SystemExit(7)")
    (wd / bootstrap.ENV_FILE).parent.mkdir(exist_ok=True)
    (wd / bootstrap.ENV_FILE).write_bytes(bootstrap.env_json({"B": "from-file"}))
    sh(bootstrap.start_command(str(wd), ["{python}", "-c", code], timeout_s=60,
                               env_file=bootstrap.ENV_FILE), env={"A": "from-exec "})
    assert status(wd) == "running"
    assert not (wd / bootstrap.ENV_FILE).exists()  # the tokens are not left on disk
    assert wait_state(wd, "exited") == "exited"
    found = bootstrap.parse_status(sh(bootstrap.status_command(str(wd))))
    assert (found.exit_code, found.timed_out) == (7, False)
    assert (wd / "out.txt").read_text() == "from-exec from-fileA"


def test_a_second_start_in_the_same_sandbox_is_refused(tmp_path: Path) -> None:
    wd = workdir(tmp_path)
    command = bootstrap.start_command(str(wd), ["{python}", "-c", "pass"], timeout_s=60)
    sh(command)
    assert wait_state(wd, "exited") == "exited"
    again = subprocess.run(["sh", "-c", command.replace("python3", sys.executable)],
                           capture_output=True, timeout=30)
    assert again.returncode == 3


def test_the_timeout_kills_the_runner_and_says_so(tmp_path: Path) -> None:
    wd = workdir(tmp_path)
    sh(bootstrap.start_command(str(wd), ["{python}", "-c", "import time; time.sleep(60)"],
                               timeout_s=1))
    assert wait_state(wd, "exited") == "exited"
    found = bootstrap.parse_status(sh(bootstrap.status_command(str(wd))))
    assert found.timed_out
    assert found.exit_code == -signal.SIGTERM


def test_a_killed_keeper_reads_as_missing(tmp_path: Path) -> None:
    wd = workdir(tmp_path)
    sh(bootstrap.start_command(str(wd), ["{python}", "-c", "import time; time.sleep(60)"],
                               timeout_s=120))
    started = json.loads((wd / bootstrap.STARTED_FILE).read_text())
    os.kill(started["pid"], signal.SIGKILL)
    os.kill(started["keeper"], signal.SIGKILL)
    assert wait_state(wd, "missing") == "missing"


def test_the_entrypoint_form_waits_for_its_launch_file(tmp_path: Path) -> None:
    wd = workdir(tmp_path)
    argv = bootstrap.run_argv(str(wd), timeout_s=60)
    proc = subprocess.Popen([sys.executable, *argv[1:]])
    try:
        assert status(wd) == "never_started"
        (wd / bootstrap.STATE_DIR).mkdir(exist_ok=True)
        (wd / bootstrap.LAUNCH_FILE).write_bytes(bootstrap.launch_json(
            ["{python}", "-c", "import os; raise SystemExit(int(os.environ['CODE']))"],
            {"CODE": "5"}, 60))
        assert proc.wait(timeout=20) == 5
    finally:
        proc.kill()
    assert status(wd) == "exited"
    assert not (wd / bootstrap.LAUNCH_FILE).exists()


@pytest.mark.parametrize("answer", [
    b"", b"not json", b'{"state": "dancing"}', b"[1]", b"x" * 5000,
])
def test_a_status_answer_that_is_not_one_is_an_error(answer: bytes) -> None:
    with pytest.raises(ProviderError):
        bootstrap.parse_status(answer)


def test_a_status_line_is_read_with_its_types() -> None:
    found = bootstrap.parse_status(b'noise\n{"state": "exited", "exit_code": true, '
                                   b'"timed_out": "yes"}\n')
    assert (found.state, found.exit_code, found.timed_out) == ("exited", None, False)


def test_the_python_placeholder_is_the_sandbox_python() -> None:
    assert bootstrap.expand(["{python}", "runner.py"]) == ["python3", "runner.py"]
    command = bootstrap.start_command("/tmp/w d", ["{python}", "r.py", "--x", "a b"],
                                      timeout_s=0.1)
    assert command.startswith("cd '/tmp/w d' && python3 playrun_boot.py start --timeout 1 --")
    assert command.endswith("python3 r.py --x 'a b'")


# The exit report: the keeper POSTs `exited` once the runner ended and its record is written.

@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[StubGateway]:
    """A gateway on loopback TCP that notes, as each report arrives, whether the exit
    record was already written."""
    stub = StubGateway(on_request=lambda: (tmp_path / "wd" / bootstrap.EXITED_FILE).exists())
    yield stub
    stub.close()


def reporting_workdir(tmp_path: Path, report: ExitReport, env: dict[str, str]) -> Path:
    wd = tmp_path / "wd"
    wd.mkdir()
    workdir(wd)
    (wd / bootstrap.STATE_DIR).mkdir()
    (wd / bootstrap.ENV_FILE).write_bytes(bootstrap.env_json(env, report))
    return wd


def start_reporting(wd: Path, argv: list[str]) -> None:
    sh(bootstrap.start_command(str(wd), argv, timeout_s=60, env_file=bootstrap.ENV_FILE))


def keeper_gone(wd: Path) -> bool:
    pid = json.loads((wd / bootstrap.STARTED_FILE).read_text())["keeper"]
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_the_keeper_reports_the_exit_with_a_token_the_runner_never_sees(
        tmp_path: Path, gateway: StubGateway) -> None:
    token = "exit-" + secrets.token_hex(16)
    wd = reporting_workdir(tmp_path, ExitReport(token, gateway.url + "/", "/no/such.sock"),
                           {"PLAYRUN_TOKEN": "runner-token"})
    start_reporting(wd, ["{python}", "-c", PROBE])
    eventually(lambda: gateway.requests, what="the exit report")
    headers, body = gateway.requests[0]
    assert headers[":request-line"] == "POST /v1/runtime HTTP/1.1"
    assert headers["authorization"] == f"Bearer {token}"
    assert headers["x-playrun-action"] == "exited"
    # A link, never followed, is a result present: the inspection decides what it is worth.
    assert json.loads(body) == {"action": "exited", "status": 5, "signal": None,
                                "result_present": True}
    assert gateway.seen == [True]  # the exit was on record before the report went
    assert status(wd) == "exited"
    seen = json.loads((wd / "seen.txt").read_text())
    env = json.loads(seen[0])
    assert env["PLAYRUN_TOKEN"] == "runner-token"  # the probe did read its env
    assert bootstrap.REPORT_KEY not in env
    assert not [found for found in seen if token in found]
    assert not (wd / bootstrap.ENV_FILE).exists()
    assert not (wd / "__pycache__").exists()
    for path in wd.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert token.encode() not in path.read_bytes(), path
    eventually(lambda: keeper_gone(wd), what="the keeper to end")
    assert len(gateway.requests) == 1


def test_a_runner_that_kills_its_own_group_is_reported_killed(
        tmp_path: Path, gateway: StubGateway) -> None:
    wd = reporting_workdir(tmp_path, ExitReport("t", gateway.url, ""), {})
    start_reporting(wd, ["{python}", "-c", "import os, signal; os.killpg(0, signal.SIGKILL)"])
    eventually(lambda: gateway.requests, what="the exit report")
    assert json.loads(gateway.requests[0][1]) == {"action": "exited", "status": None,
                                                  "signal": 9, "result_present": False}
    assert bootstrap.parse_status(sh(bootstrap.status_command(str(wd)))).exit_code == -9


def test_the_entrypoint_form_reports_from_its_launch_file(
        tmp_path: Path, gateway: StubGateway) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    workdir(wd)
    token = "exit-" + secrets.token_hex(16)
    proc = subprocess.Popen([sys.executable, *bootstrap.run_argv(str(wd), timeout_s=60)[1:]])
    try:
        (wd / bootstrap.STATE_DIR).mkdir()
        (wd / bootstrap.LAUNCH_FILE).write_bytes(bootstrap.launch_json(
            ["{python}", "-c", PROBE], {}, 60, ExitReport(token, gateway.url, "")))
        assert proc.wait(timeout=20) == 5
    finally:
        proc.kill()
    assert gateway.seen == [True]
    assert json.loads(gateway.requests[0][1])["status"] == 5
    seen = json.loads((wd / "seen.txt").read_text())
    assert not [found for found in seen if token in found]
    assert bootstrap.REPORT_KEY not in json.loads(seen[0])
    assert not (wd / bootstrap.LAUNCH_FILE).exists()


def test_a_gateway_that_never_answers_costs_the_keeper_its_budget_at_most(
        tmp_path: Path) -> None:
    silent = StubGateway(status=None)
    try:
        wd = reporting_workdir(tmp_path, ExitReport("t", silent.url, ""), {})
        start_reporting(wd, ["{python}", "-c", "pass"])
        # The exit record comes first: a worker polling meanwhile sees the exit.
        assert wait_state(wd, "exited") == "exited"
        ended = time.monotonic()
        eventually(lambda: keeper_gone(wd), timeout=report_mod.BUDGET_S + 10,
                   what="the keeper to give up")
        assert time.monotonic() - ended < report_mod.BUDGET_S + 2
        log = (wd / bootstrap.LOG_FILE).read_text()
        assert "exit report was not delivered" in log
        assert 1 <= len(silent.requests) <= report_mod.TRIES
    finally:
        silent.close()


def test_without_a_report_nothing_is_sent(tmp_path: Path, gateway: StubGateway) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    workdir(wd)
    (wd / bootstrap.STATE_DIR).mkdir()
    (wd / bootstrap.ENV_FILE).write_bytes(bootstrap.env_json({"A": "1"}))
    start_reporting(wd, ["{python}", "-c", "pass"])
    assert wait_state(wd, "exited") == "exited"
    eventually(lambda: keeper_gone(wd), what="the keeper to end")
    assert gateway.requests == []


def test_the_boot_script_and_its_host_agree_on_the_report() -> None:
    files = bootstrap.files_for(SandboxSpec(labels={}))
    assert f"{playrun_boot.REPORT_MODULE}.py" == bootstrap.REPORT_FILE
    assert playrun_boot.REPORT_KEY == bootstrap.REPORT_KEY
    assert files[bootstrap.REPORT_FILE] == Path(report_mod.__file__).read_bytes()
    assert b"import playrun_protocol as protocol" in files[bootstrap.REPORT_FILE]
    assert "playrun_protocol.py" in files
    # The socket is the host's alone: a remote sandbox is told the URL.
    doc = json.loads(bootstrap.env_json({"A": "1"}, ExitReport("t", "https://gw", "/s")))
    assert doc == {"A": "1", bootstrap.REPORT_KEY: {"token": "t", "url": "https://gw"}}
