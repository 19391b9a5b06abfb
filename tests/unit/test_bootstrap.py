"""The boot script that starts and watches the runner in a remote sandbox, run for real
in a directory standing in for the sandbox's workdir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.sandbox import ProviderError, SandboxSpec
from tasks.sandbox.providers import bootstrap


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
