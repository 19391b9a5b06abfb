"""Process helpers shared by the stacks, the metrics endpoints, tests and benchmarks."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1


def pid_alive(pid: int) -> bool:
    """A process with this pid exists (ours or not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def die_with_parent() -> None:
    """In a child (`preexec_fn`): SIGKILL it when its parent dies, so a killed test run
    or benchmark never leaves a worker consuming the next one's tasks. Linux only."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def reap_group(pgid: int, deadline: float) -> None:
    """Wait until the group's members (a worker's pool children) are gone; SIGKILL them
    once the deadline has passed."""
    while True:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 5
        time.sleep(0.05)


def stop_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM,
               timeout: float = 15.0) -> None:
    """Signal a child's whole process group; SIGKILL it if it has not gone in `timeout`."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reap_group(proc.pid, time.monotonic() + timeout)
