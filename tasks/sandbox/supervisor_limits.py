"""The supervisor's limits: rlimits for the play, cgroup v2 where delegated, the disk cap.

Standard library only: copied beside supervisor.py into each control record.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

NOFILE_LIMIT = 256
# CPU seconds granted beyond the wall clock when no explicit CPU limit was given.
CPU_SLACK_S = 5
# The directory's size is checked this often at most; a walk that takes longer spaces the
# checks out so the supervisor spends at most ~2% of a CPU on them.
DISK_CHECK_S = 0.1
DISK_CHECK_COST_FACTOR = 50
DISK_MAX_ENTRIES = 100_000
CGROUP_EMPTY_WAIT_S = 1.0


def cgroup_enter(path: Path, limits: dict[str, str], pid: int) -> list[str]:
    """Create the sandbox's cgroup, write its limits, move `pid` in (its children follow).
    Returns the limits applied; raises OSError if the cgroup cannot hold the process."""
    path.mkdir(mode=0o755, exist_ok=True)
    applied = []
    for name, value in limits.items():
        try:
            (path / name).write_text(value)
            applied.append(name)
        except OSError:
            if name != "memory.swap.max":  # absent without swap accounting: fine
                raise
    (path / "cgroup.procs").write_text(str(pid))
    return applied


def cgroup_kill(path: Path, wait_s: float = CGROUP_EMPTY_WAIT_S) -> None:
    """Kill everything in the cgroup (cgroup.kill on v2, each listed process on v1) and
    remove it once empty: killed processes leave it a moment after the signal."""
    try:
        (path / "cgroup.kill").write_text("1")
    except OSError:
        with contextlib.suppress(OSError):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.01)


def apply_limits(config: dict[str, Any], timeout_s: float) -> None:
    def hard(which: int, value: int) -> None:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError) as exc:
            print(f"supervisor: cannot set rlimit {which}: {exc}", file=sys.stderr)

    nice = config.get("nice")
    if isinstance(nice, int) and 0 < nice <= 19:
        try:  # before the play starts; without CAP_SYS_NICE it cannot undo it
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError as exc:
            print(f"supervisor: cannot set niceness: {exc}", file=sys.stderr)
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


def disk_usage(path: Path, max_entries: int = DISK_MAX_ENTRIES) -> tuple[int, int]:
    """(bytes allocated, entries seen) under path, without following symlinks; stops
    counting entries at max_entries."""
    total, entries = 0, 0
    stack = [str(path)]
    while stack and entries <= max_entries:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                for entry in it:
                    entries += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return total, entries
