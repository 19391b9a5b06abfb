"""The first process of a local sandbox: limits, starts and times one child, records its exit.

Standard library only: the local provider copies this file and its siblings (SUPERVISOR_FILES
in tasks/sandbox/local/records.py) into the sandbox's control directory (outside the sandbox)
and runs it as ``python -I <control>/supervisor.py <control> <sandbox>``, handing it the exec
config (argv, env, limits, and the token of its exit report, supervisor_report.py) on stdin,
so the env and the tokens are never written to disk. In `process` isolation it runs inside
the sandbox's PID namespace (or as a subreaper) on the host filesystem; in `strict` isolation
it stays on the host and runs the child under bubblewrap, so nothing the play does can touch
its timer, its records or its console log. A sandbox created by one release runs under its
own copy. The provider imports the /proc helpers (supervisor_proc.py) so process-tree
handling lives in one place.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported by the worker as tasks.sandbox.*
    from tasks.sandbox.supervisor_limits import (
        DISK_CHECK_COST_FACTOR,
        DISK_CHECK_S,
        DISK_MAX_ENTRIES,
        apply_limits,
        disk_usage,
    )
    from tasks.sandbox.supervisor_proc import (
        CONSOLE_FILE,
        EXIT_FILE,
        kill_tree,
        process_table,
        subtree,
        write_atomic,
    )
    from tasks.sandbox.supervisor_report import has_result, report_exit
    from tasks.sandbox.supervisor_strict import StrictChild
else:  # run as a script: `python -I` puts no directory on sys.path, so add its own
    sys.dont_write_bytecode = True  # the control record holds only what the provider wrote
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from supervisor_limits import (
        DISK_CHECK_COST_FACTOR,
        DISK_CHECK_S,
        DISK_MAX_ENTRIES,
        apply_limits,
        disk_usage,
    )
    from supervisor_proc import (
        CONSOLE_FILE,
        EXIT_FILE,
        kill_tree,
        process_table,
        subtree,
        write_atomic,
    )
    from supervisor_report import has_result, report_exit
    from supervisor_strict import StrictChild

CONSOLE_MAX_BYTES = 1024 * 1024
PR_SET_CHILD_SUBREAPER = 36
SPAWN_FAILED_EXIT = 127


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


def _spawn(argv: list[str], out_fd: int, env: dict[str, str]) -> int:
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out_fd, 1),
        (os.POSIX_SPAWN_DUP2, out_fd, 2),
    ]
    # Python ignores SIGPIPE and SIGXFSZ; ignored dispositions survive exec, so reset them.
    return os.posix_spawnp(
        argv[0],
        argv,
        env,
        file_actions=actions,
        setsid=True,
        setsigmask=(),
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
    )


def _read_config(control: Path) -> dict[str, Any] | None:
    """The exec config from stdin; None if the launcher died before handing it over
    whole (it writes the process record first, so that case must be told apart)."""
    data = sys.stdin.buffer.read()
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    if not data:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None  # cut off mid-write
    if not isinstance(value, dict):
        raise ValueError("the exec config is not an object")
    return value


def _never_started(control: Path) -> int:
    """Say that nothing was started, so the run is tried again rather than lost."""
    with contextlib.suppress(OSError), open(control / CONSOLE_FILE, "ab") as console:
        console.write(b"supervisor: no exec config (its launcher died?); nothing run\n")
    record = {
        "exit_code": None,
        "timed_out": False,
        "limit": None,
        "never_started": True,
        "finished_at": time.time(),
    }
    write_atomic(control / EXIT_FILE, json.dumps(record).encode())
    return 0


def _exit_code(status: int, strict: bool) -> int:
    code = os.waitstatus_to_exitcode(status)
    # bwrap reports a command killed by signal N as 128 + N.
    if strict and 128 < code < 128 + 65:
        return -(code - 128)
    return code


def supervise(control: Path, sandbox: Path) -> int:
    config = _read_config(control)
    if config is None:
        return _never_started(control)
    argv = [str(part) for part in config["argv"]]
    env = {str(k): str(v) for k, v in dict(config.get("env") or os.environ).items()}
    timeout_s = float(config["timeout_s"])
    dir_cap = config.get("max_dir_mb")
    cap_bytes = int(dir_cap) * 1024 * 1024 if dir_cap is not None else None
    strict_cfg = config.get("strict")
    if strict_cfg is None:
        # The play inherits them; in strict mode only bwrap's child gets them (preexec).
        apply_limits(config, timeout_s)
    if strict_cfg is None and os.getpid() != 1:
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
    limit: str | None = None
    exit_code: int | None = None
    strict: StrictChild | None = None
    try:
        if strict_cfg is not None:
            strict = StrictChild(
                strict_cfg, argv, env, write_fd, control, lambda: apply_limits(config, timeout_s)
            )
            child = strict.pid
        else:
            child = _spawn(argv, write_fd, env)
    except (OSError, subprocess.SubprocessError) as exc:
        console.feed(f"supervisor: cannot start {argv[0]!r}: {exc}\n".encode())
        exit_code, child = SPAWN_FAILED_EXIT, -1
    os.close(write_fd)

    def stop() -> None:
        if strict is not None:
            strict.kill()
        else:
            kill_tree([child])

    next_disk = time.monotonic() + DISK_CHECK_S
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
                exit_code = _exit_code(status, strict is not None)
        if exit_code is not None:
            break
        now = time.monotonic()
        remaining = deadline - now
        if remaining <= 0 and not timed_out:
            timed_out = True
            stop()
        if cap_bytes is not None and limit is None and now >= next_disk:
            used, entries = disk_usage(sandbox)
            cost = time.monotonic() - now
            next_disk = now + max(DISK_CHECK_S, cost * DISK_CHECK_COST_FACTOR)
            if used > cap_bytes or entries > DISK_MAX_ENTRIES:
                limit = "disk"
                console.feed(
                    f"supervisor: the sandbox holds {used >> 20} MB in {entries} entries, "
                    f"over its cap of {int(dir_cap or 0)} MB or {DISK_MAX_ENTRIES} entries; "
                    "stopped\n".encode()
                )
                stop()
        # SIGCHLD wakes the select through the wakeup fd; the cap only bounds clock drift.
        wait = min(max(remaining, 0.0), 1.0)
        if timed_out or limit:
            wait = 1.0
        elif cap_bytes is not None:
            wait = min(wait, max(next_disk - time.monotonic(), 0.0))
        ready, _, _ = select.select(open_fds, [], [], wait)
        for fd in ready:
            data = os.read(fd, 65536)
            if fd == read_fd:
                console.feed(data)
                if not data:
                    open_fds.remove(read_fd)

    # The play ended: nothing it started may outlive it.
    if strict is not None:
        strict.kill(reaped=True)
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
    record = {
        "exit_code": exit_code,
        "timed_out": timed_out,
        "limit": limit,
        "finished_at": time.time(),
    }
    write_atomic(control / EXIT_FILE, json.dumps(record).encode())
    report = config.get("report")
    if isinstance(report, dict):  # after the record: the inspection it starts finds it
        report_exit(report, exit_code, has_result(sandbox))
    return 0


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1]), Path(sys.argv[2])))
