"""The first process of a local sandbox: limits, starts and times one child, records its exit.

Standard library only: the local provider copies this file into each sandbox and runs it as
``python -I <sandbox>/.playrun/supervisor.py <sandbox>``. The provider also imports the /proc
helpers below so process-tree handling lives in one place.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CONTROL_DIR = ".playrun"
EXEC_FILE = "exec.json"
EXIT_FILE = "exit.json"
CONSOLE_FILE = "console.log"
CONSOLE_MAX_BYTES = 1024 * 1024
NOFILE_LIMIT = 256
# CPU seconds granted beyond the wall clock when no explicit CPU limit was given.
CPU_SLACK_S = 5
PR_SET_CHILD_SUBREAPER = 36
SPAWN_FAILED_EXIT = 127


# --- /proc helpers (shared with the provider) ------------------------------------------


def read_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgrp, starttime) of a process, or None if it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    # comm may contain spaces and parentheses: the fields start after the last ')'.
    rest = raw[raw.rindex(b")") + 2 :].split()
    return rest[0].decode(), int(rest[1]), int(rest[2]), int(rest[19])


def read_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_live(pid: int) -> bool:
    """True if the pid exists and is not a zombie."""
    stat = read_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def process_table() -> dict[int, int]:
    """pid -> ppid of every live process visible in /proc."""
    table: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = read_stat(int(entry.name))
        if stat is not None and stat[0] not in ("Z", "X"):
            table[int(entry.name)] = stat[1]
    return table


def subtree(roots: Iterable[int], table: dict[int, int]) -> set[int]:
    """The live roots and all their live descendants."""
    children: dict[int, list[int]] = {}
    for pid, ppid in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [pid for pid in roots if pid in table]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


def processes_matching(cmdline_part: str, environ_entry: bytes) -> set[int]:
    """Pids with an argument containing cmdline_part, or exactly environ_entry in their
    initial environment."""
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if any(cmdline_part in arg for arg in read_cmdline(pid)):
            found.add(pid)
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if environ_entry in environ.split(b"\0"):
            found.add(pid)
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def kill_tree(roots: Iterable[int]) -> set[int]:
    """SIGKILL the roots, their process groups and every descendant; returns the pids hit.

    The tree is frozen with SIGSTOP first (a stopped process cannot fork or be reparented
    away from us), re-scanning until no new process appears, then killed.
    """
    roots = [pid for pid in roots if pid > 1 and pid != os.getpid()]
    stopped: set[int] = set()
    for _ in range(64):
        tree = subtree(roots, process_table()) - {os.getpid()}
        new = tree - stopped
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        stopped |= new
    for pid in roots:
        # Only groups a root leads: never the caller's own group.
        try:
            if os.getpgid(pid) == pid and pid != os.getpgid(0):
                os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    return stopped


def write_atomic(path: Path, data: bytes) -> None:
    """Write tmp, fsync, rename, fsync the directory: readers see all or nothing."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


# --- the supervisor itself -------------------------------------------------------------


def _apply_limits(config: dict[str, Any], timeout_s: float) -> None:
    def hard(which: int, value: int) -> None:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError) as exc:
            print(f"supervisor: cannot set rlimit {which}: {exc}", file=sys.stderr)

    hard(resource.RLIMIT_CORE, 0)
    hard(resource.RLIMIT_NOFILE, NOFILE_LIMIT)
    hard(resource.RLIMIT_FSIZE, int(config["max_file_mb"]) * 1024 * 1024)
    hard(resource.RLIMIT_AS, int(config["memory_mb"]) * 1024 * 1024)
    cpu = config.get("cpu_seconds")
    soft = int(cpu) if cpu is not None else int(timeout_s) + 1 + CPU_SLACK_S
    # Soft limit sends SIGXCPU (the runner reports RUN_TIMEOUT); the hard one kills.
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + CPU_SLACK_S))
    except (ValueError, OSError) as exc:
        print(f"supervisor: cannot set RLIMIT_CPU: {exc}", file=sys.stderr)


class _Console:
    """Keeps the first CONSOLE_MAX_BYTES of the child's stdout/stderr, counts the rest."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self.written = 0
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = CONSOLE_MAX_BYTES - self.written
        keep = data[: max(room, 0)]
        if keep:
            with contextlib.suppress(OSError):
                os.write(self.fd, keep)
            self.written += len(keep)
        self.dropped += len(data) - len(keep)

    def close(self) -> None:
        if self.dropped:
            note = f"\n[supervisor: console truncated, {self.dropped} bytes dropped]\n"
            with contextlib.suppress(OSError):
                os.write(self.fd, note.encode())
        os.close(self.fd)


def _spawn(argv: list[str], out_fd: int) -> int:
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out_fd, 1),
        (os.POSIX_SPAWN_DUP2, out_fd, 2),
    ]
    # Python ignores SIGPIPE and SIGXFSZ; ignored dispositions survive exec, so reset them.
    return os.posix_spawnp(
        argv[0],
        argv,
        dict(os.environ),
        file_actions=actions,
        setsid=True,
        setsigmask=(),
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
    )


def supervise(sandbox: Path) -> int:
    control = sandbox / CONTROL_DIR
    config = json.loads((control / EXEC_FILE).read_text())
    argv = [str(part) for part in config["argv"]]
    timeout_s = float(config["timeout_s"])
    _apply_limits(config, timeout_s)
    if os.getpid() != 1:
        # Orphaned grandchildren (even setsid ones) reparent to us, so we can still kill them.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    console = _Console(control / CONSOLE_FILE)
    read_fd, write_fd = os.pipe()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)

    deadline = time.monotonic() + timeout_s
    timed_out = False
    exit_code: int | None = None
    try:
        child = _spawn(argv, write_fd)
    except OSError as exc:
        console.feed(f"supervisor: cannot start {argv[0]!r}: {exc}\n".encode())
        exit_code, child = SPAWN_FAILED_EXIT, -1
    os.close(write_fd)

    open_fds = [read_fd, wake_r]
    while exit_code is None:
        # Reap everything: as subreaper / pid 1 we inherit the play's orphans.
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == child:
                exit_code = os.waitstatus_to_exitcode(status)
        if exit_code is not None:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0 and not timed_out:
            timed_out = True
            kill_tree([child])
        # SIGCHLD wakes the select through the wakeup fd; the cap only bounds clock drift.
        wait = 1.0 if timed_out else min(max(remaining, 0.0), 1.0)
        ready, _, _ = select.select(open_fds, [], [], wait)
        for fd in ready:
            data = os.read(fd, 65536)
            if fd == read_fd:
                console.feed(data)
                if not data:
                    open_fds.remove(read_fd)

    # The play ended: nothing it started may outlive it.
    kill_tree(subtree([os.getpid()], process_table()) - {os.getpid()})
    if read_fd in open_fds:
        drain_until = time.monotonic() + 0.5
        while time.monotonic() < drain_until:
            ready, _, _ = select.select([read_fd], [], [], 0.1)
            if ready:
                data = os.read(read_fd, 65536)
                if not data:
                    break
                console.feed(data)
    console.close()
    record = {"exit_code": exit_code, "timed_out": timed_out, "finished_at": time.time()}
    write_atomic(control / EXIT_FILE, json.dumps(record).encode())
    return 0


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
