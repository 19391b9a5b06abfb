"""Several gateway processes on the same listening sockets: fork them, restart one that
dies, stop them all on SIGTERM or SIGINT.

The parent binds the sockets and forks; each child serves them with its own event loop,
so a request that holds a child's loop holds one process, and the kernel hands new
connections to whichever child accepts first (an idle one). The parent serves nothing:
it only watches. Children die with it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn

from tasks.host.processes import die_with_parent

log = logging.getLogger("playrun.gateway")

# A child calls its argument once it serves.
Target = Callable[[Callable[[], None]], None]
# A child that dies sooner than this after its start is restarted only after this long:
# a child that cannot start never makes the parent fork in a loop.
RESTART_BACKOFF_S = 1.0
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class _Child:
    pid: int
    ready_fd: int
    started: float
    ready: bool = False


def describe(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


class Supervisor:
    """Runs `count` children of `target`; `on_ready` once all of them serve for the first
    time; `on_exit(pid)` for each child that ended."""

    def __init__(self, count: int, target: Target, *, on_ready: Callable[[], None],
                 on_exit: Callable[[int], None], stop_timeout_s: float = 15.0) -> None:
        self.count = count
        self.target = target
        self.on_ready = on_ready
        self.on_exit = on_exit
        self.stop_timeout_s = stop_timeout_s
        self.children: dict[int, _Child] = {}
        self.restarts: list[float] = []  # when each pending restart is due
        self.announced = False
        self.stopping = False
        self.forced = False
        self.failed: int | None = None
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.parent_pid = os.getpid()

    # --- the parent -----------------------------------------------------------------------

    def run(self) -> int:
        """Until a signal stops it: 0, or the status of a child that failed to start."""
        for sock in (self.wake_r, self.wake_w):
            sock.setblocking(False)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        saved = {sig: signal.signal(sig, self._stop) for sig in _SIGNALS}
        saved[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, _ignore)
        previous_fd = signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        try:
            for _ in range(self.count):
                self._fork()
            while not self.stopping:
                self._wait(self._next_timeout())
                self._reap()
                self._restart_due()
            self._stop_all()
        finally:
            signal.set_wakeup_fd(previous_fd)
            for sig, handler in saved.items():
                signal.signal(sig, handler)
            self.selector.close()
            self.wake_r.close()
            self.wake_w.close()
        return self.failed or 0

    def _stop(self, _sig: int, _frame: FrameType | None) -> None:
        self.forced = self.stopping  # a second signal: do not wait for them
        self.stopping = True

    def _next_timeout(self) -> float:
        if not self.restarts:
            return 1.0
        return max(min(self.restarts) - time.monotonic(), 0.0)

    def _wait(self, timeout: float) -> None:
        for key, _events in self.selector.select(timeout):
            if key.fileobj is self.wake_r:
                with contextlib.suppress(BlockingIOError):
                    while self.wake_r.recv(512):
                        pass
                continue
            self._read_ready(key.data, int(key.fd))

    def _read_ready(self, pid: int, fd: int) -> None:
        try:
            said = os.read(fd, 1)
        except OSError:
            said = b""
        child = self.children.get(pid)
        if child is None:  # never: a pipe is forgotten when its child is reaped
            self.selector.unregister(fd)
            os.close(fd)
            return
        self._forget(child)
        if not said:
            return  # it died before it served: _reap sees it
        child.ready = True
        if not self.announced and sum(c.ready for c in self.children.values()) == self.count:
            self.announced = True
            self.on_ready()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue
            self._forget(child)
            self.on_exit(pid)
            if self.stopping:
                continue
            if not self.announced:
                log.error("gateway process %d ended before it served (%s); stopping",
                          pid, describe(status))
                self.failed = max(os.waitstatus_to_exitcode(status), 1)
                self.stopping = True
                continue
            lived = time.monotonic() - child.started
            log.warning("gateway process %d ended (%s); starting another", pid,
                        describe(status))
            self.restarts.append(time.monotonic()
                                 + (RESTART_BACKOFF_S if lived < RESTART_BACKOFF_S else 0.0))

    def _forget(self, child: _Child) -> None:
        """Close its end of the pipe once (the number may soon be another pipe's)."""
        if child.ready_fd >= 0:
            self.selector.unregister(child.ready_fd)
            os.close(child.ready_fd)
            child.ready_fd = -1

    def _restart_due(self) -> None:
        now = time.monotonic()
        due = [at for at in self.restarts if at <= now]
        self.restarts = [at for at in self.restarts if at > now]
        for _ in due:
            if not self.stopping:
                self._fork()

    def _stop_all(self) -> None:
        """SIGTERM each child (each sends its queued releases as it goes); SIGKILL those
        still there after the timeout, or at once on a second signal."""
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        while self.children and time.monotonic() < deadline and not self.forced:
            self._wait(0.1)
            self._reap()
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self._forget(self.children.pop(pid))
            self.on_exit(pid)

    def _fork(self) -> None:
        ready_r, ready_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            self._child(ready_w)
        os.close(ready_w)
        self.children[pid] = _Child(pid, ready_r, time.monotonic())
        self.selector.register(ready_r, selectors.EVENT_READ, pid)

    # --- a child --------------------------------------------------------------------------

    def _child(self, ready_w: int) -> NoReturn:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sig in (*_SIGNALS, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            for child in self.children.values():  # the pipes of siblings not yet ready
                if child.ready_fd >= 0:
                    os.close(child.ready_fd)
            self.selector.close()
            self.wake_r.close()
            self.wake_w.close()
            die_with_parent()
            if os.getppid() != self.parent_pid:  # the parent died before prctl
                os._exit(0)

            def ready() -> None:
                os.write(ready_w, b"1")

            self.target(ready)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            log.exception("gateway process failed")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            logging.shutdown()
            os._exit(code)


def _ignore(_sig: int, _frame: FrameType | None) -> None:
    """SIGCHLD needs a handler of its own to wake the parent (signal.set_wakeup_fd)."""
