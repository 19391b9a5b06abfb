"""The supervisor's /proc helpers and its record files, shared with the local provider.

Standard library only: copied beside supervisor.py into each control record.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from pathlib import Path

# The provider's files once lived in this directory inside the sandbox; the name stays
# reserved (read_file maps it onto the control directory).
CONTROL_DIR = ".playrun"
EXIT_FILE = "exit.json"
NS_FILE = "ns.json"
CONSOLE_FILE = "console.log"


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


def signal_quietly(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def kill_tree(roots: Iterable[int]) -> set[int]:
    """SIGKILL the roots, their process groups and every descendant; returns the pids hit.

    The tree is frozen with SIGSTOP first (a stopped process cannot fork or be reparented
    away from us), re-scanning until no new process appears, then killed.
    """
    roots = [pid for pid in roots if pid > 1 and pid != os.getpid()]
    stopped: set[int] = set()
    if not roots:
        return stopped
    for _ in range(64):
        tree = subtree(roots, process_table()) - {os.getpid()}
        new = tree - stopped
        if not new:
            break
        for pid in new:
            signal_quietly(pid, signal.SIGSTOP)
        stopped |= new
    for pid in roots:
        # Only groups a root leads: never the caller's own group.
        try:
            if os.getpgid(pid) == pid and pid != os.getpgid(0):
                os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in stopped:
        signal_quietly(pid, signal.SIGKILL)
    return stopped


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write tmp, fsync, rename, fsync the directory: readers see all or nothing (and,
    if durable, so does the disk after a power loss)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if not durable:
        return
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def pidns_of(pid: int) -> int | None:
    """Inode of a process's PID namespace (needs ptrace-read access to it), or None."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None
