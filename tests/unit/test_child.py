"""tasks.testing's Child, which the stack's processes (and this suite's Worker and Gateway)
are: readiness from the log, a clear error when the process exits or stays silent, the
whole process group stopped, restarts appending to one log."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tasks.errors import ProcessNotReadyError
from tasks.testing.child import Child

# Says it is ready, then waits to be stopped.
SERVES = ("import time\n"
          "print('starting', flush=True)\n"
          "print('serving', flush=True)\n"
          "time.sleep(600)\n")
# The same with a child of its own, forked before it is ready.
FORKS = ("import os, time\n"
         "if os.fork() == 0:\n"
         "    time.sleep(600)\n" + SERVES)


def child(tmp_path: Path, source: str, ready: str | None = "serving") -> Child:
    return Child("probe", [sys.executable, "-c", source], {"PATH": "/usr/bin:/bin"},
                 tmp_path / "logs" / "probe.log", ready_text=ready)


def test_ready_once_the_log_says_so_and_stopped_with_its_group(tmp_path: Path) -> None:
    with child(tmp_path, FORKS) as probe:
        assert probe.running and "serving" in probe.output()
        (forked,) = probe.child_pids()
        assert Path(f"/proc/{forked}").exists()
        assert "probe" in repr(probe)
    assert not probe.running
    assert probe.proc is not None and probe.proc.returncode == -signal.SIGTERM


def test_a_restart_appends_to_the_log_and_waits_for_this_life(tmp_path: Path) -> None:
    probe = child(tmp_path, SERVES).start().wait_ready()
    try:
        first = probe.pid
        probe.restart()
        assert probe.pid != first
        assert probe.output().count("serving") == 2
        assert probe.since_start().count(b"serving") == 1
        probe.wait_for("serving", timeout=5)
    finally:
        probe.stop()


def test_a_process_that_exits_before_ready_names_its_code_and_log(tmp_path: Path) -> None:
    probe = child(tmp_path, "print('bad config'); raise SystemExit(3)").start()
    with pytest.raises(ProcessNotReadyError) as err:
        probe.wait_ready(30)
    assert "code 3" in str(err.value) and "bad config" in str(err.value)
    assert err.value.code == "PROCESS_NOT_READY"
    probe.stop()


def test_a_silent_process_is_not_ready_after_its_timeout(tmp_path: Path) -> None:
    probe = child(tmp_path, "import time; time.sleep(600)").start()
    try:
        with pytest.raises(ProcessNotReadyError, match="not ready after 0.3 s"):
            probe.wait_ready(0.3)
        probe.kill(signal.SIGKILL)
        assert probe.proc is not None and probe.proc.wait(10) == -signal.SIGKILL
    finally:
        probe.stop()


def test_a_child_never_started_says_so(tmp_path: Path) -> None:
    probe = child(tmp_path, "pass", ready=None)
    assert probe.output() == "" and probe.since_start() == b"" and not probe.running
    with pytest.raises(ProcessNotReadyError, match="never started"):
        probe.pid  # noqa: B018 - the property is what is tested
    probe.stop()  # harmless
