"""One managed subprocess: its own process group, a log file, readiness by polling.

Subclasses say what "ready" means (a line in the log, an answering port); stop() ends the
whole group (a Celery worker's pool children included). Every child dies with its parent
(Linux), so a killed test run never leaves a worker consuming the next run's tasks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from tasks.errors import ProcessNotReadyError
from tasks.host.processes import die_with_parent, stop_group

# The directory holding the `tasks` package: children run there so `celery -A tasks` and
# `python -m tasks.cli.main` import this very package, never a `tasks` in the caller's cwd.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.05
# How much of a log an error quotes.
_TAIL = 3000


class Child:
    """A subprocess in a session of its own, its output in `log_path` (appended to)."""

    # A line the process prints once it serves (None: started is ready).
    ready_text: str | None = None
    ready_timeout: float = 60.0

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        ready_text: str | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.cwd = cwd or PACKAGE_ROOT
        if ready_text is not None:
            self.ready_text = ready_text
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: IO[bytes] | None = None
        self.log_from = 0  # where this life's output starts in the log

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, pid={self.proc and self.proc.pid})"

    def start(self) -> Self:
        """Start the process (again, after stop or kill); does not wait for readiness."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.log_from = self.log.tell()
        # PR_SET_PDEATHSIG fires when the starting *thread* ends: start children from a
        # thread that outlives them (the main one).
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=str(self.cwd),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
        )
        return self

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ProcessNotReadyError(f"{self.name} was never started")
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        """The whole log (every life of the process)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def since_start(self) -> bytes:
        """What this life of the process has written so far."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_from)
                return f.read()
        except FileNotFoundError:
            return b""

    def is_ready(self) -> bool:
        """Polled by wait_ready while the process runs; subclasses add their own checks."""
        return self.ready_text is None or self.ready_text.encode() in self.since_start()

    def wait_ready(self, timeout: float | None = None) -> Self:
        """Poll is_ready() until it holds; raise (quoting the log) if the process exits or
        the timeout passes first."""
        limit = self.ready_timeout if timeout is None else timeout
        self.wait_until(self.is_ready, limit, f"ready after {limit:g} s")
        return self

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        """Until this life's log contains `text`."""
        self.wait_until(
            lambda: text.encode() in self.since_start(), timeout, f"{text!r} after {timeout:g} s"
        )

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise ProcessNotReadyError(
                    f"{self.name} exited (code {code}); see "
                    f"{self.log_path}:\n{self.output()[-_TAIL:]}"
                )
            if check():
                return
            if time.monotonic() > deadline:
                raise ProcessNotReadyError(
                    f"{self.name} not {what}; see {self.log_path}:\n{self.output()[-_TAIL:]}"
                )
            time.sleep(POLL_S)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole group (the process and every child it forked); no waiting."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        """Signal the group, wait for it to go (SIGKILL after `timeout`), close the log."""
        if self.proc is not None:
            stop_group(self.proc, sig, timeout)
        if self.log is not None:
            self.log.close()
            self.log = None

    def restart(self, sig: int = signal.SIGKILL, timeout: float | None = None) -> Self:
        """Stop (by default as a crash would) and start again, ready."""
        self.stop(sig)
        return self.start().wait_ready(timeout)

    def child_pids(self) -> list[int]:
        """The direct children of the process (a worker's pool), from /proc."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            if int(stat[stat.rindex(b")") + 2 :].split()[1]) == self.pid:
                found.append(int(entry.name))
        return found

    def __enter__(self) -> Self:
        if self.proc is None:
            self.start()
        return self.wait_ready()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
