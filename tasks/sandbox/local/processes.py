"""Process bookkeeping for local sandboxes: starting a supervisor's process group, reaping
the ones this process started, and finding and killing everything a sandbox runs, from
records and /proc entries the play cannot change."""

from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from tasks.sandbox import supervisor_limits, supervisor_proc, supervisor_strict
from tasks.sandbox.base import ProviderError
from tasks.sandbox.local.records import META_FILE, PROC_FILE, SUPERVISOR_FILE, read_json

DELETE_WAIT_S = 2.0
POLL_INTERVAL_S = 0.01
# A supervisor that wrote its exit record is finishing: worth waiting this long for it to
# exit rather than scanning /proc for what it ran.
EXITING_WAIT_S = 0.5

_pidns_lock = threading.Lock()
_pidns_probe: str | None = None  # path of a working `unshare`, "" if unavailable
# Popen handles of sandboxes this process started, so their exits are reaped (no zombies).
_children: dict[int, subprocess.Popen[bytes]] = {}
_children_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A forked worker child is not the parent of these processes and must not reap them;
    # fresh locks, in case another thread held one at fork time.
    global _children_lock, _pidns_lock
    _children.clear()
    _children_lock = threading.Lock()
    _pidns_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def pid_namespace_command() -> list[str]:
    """The unshare prefix for a private PID namespace, or [] if this machine refuses it.

    Probed once per process: root (or user namespaces) plus a mountable /proc are needed.
    """
    global _pidns_probe
    with _pidns_lock:
        if _pidns_probe is None:
            _pidns_probe = ""
            unshare = shutil.which("unshare")
            if unshare:
                cmd = [unshare, "--pid", "--fork", "--kill-child", "--mount-proc", "true"]
                try:
                    done = subprocess.run(cmd, capture_output=True, timeout=10, check=False)
                    if done.returncode == 0:
                        _pidns_probe = unshare
                except (OSError, subprocess.SubprocessError):
                    pass
        if not _pidns_probe:
            return []
        return [_pidns_probe, "--pid", "--fork", "--kill-child", "--mount-proc"]


def reap_children() -> None:
    with _children_lock:
        for pid, proc in builtins.list(_children.items()):
            if proc.poll() is not None:
                del _children[pid]


def track_child(proc: subprocess.Popen[bytes]) -> None:
    """Keep the handle of a supervisor this process started, so reap_children reaps it."""
    with _children_lock:
        _children[proc.pid] = proc


def abandon_child(proc: subprocess.Popen[bytes], control: Path) -> None:
    """A supervisor that never got its config: killed (its own session) and forgotten, so
    no process waits on its stdin and the sandbox reads `never_started`."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    with contextlib.suppress(OSError):
        (control / PROC_FILE).unlink(missing_ok=True)


def is_live(pid: int) -> bool:
    """True if the pid exists and is not a zombie."""
    stat = supervisor_proc.read_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def find_processes(
    cmdline_part: str, argv0: str, environ_entry: bytes | None, pidns: int | None
) -> set[int]:
    """One pass over /proc: pids with an argument containing cmdline_part, argv[0] equal to
    argv0, in PID namespace `pidns`, or (when given) exactly environ_entry in their
    initial environment (the costly check, so last)."""
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pidns is not None and supervisor_proc.pidns_of(pid) == pidns:
            found.add(pid)
            continue
        cmdline = supervisor_proc.read_cmdline(pid)
        if cmdline[:1] == [argv0] or any(cmdline_part in arg for arg in cmdline):
            found.add(pid)
            continue
        if environ_entry is not None:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if environ_entry in environ.split(b"\0"):
                found.add(pid)
    return found


def live_pidns(ns: dict[str, object]) -> int | None:
    """The PID namespace of a strict sandbox's NS record while the recorded init (checked by
    start time) is alive in it, else None. Once the init is gone so is the namespace, and
    the kernel hands its inode number to the next namespace made: another sandbox's."""
    init, pidns = ns.get("init_pid"), ns.get("pidns")
    if not isinstance(init, int) or not isinstance(pidns, int):
        return None
    stat_ = supervisor_proc.read_stat(init)
    if stat_ is None or stat_[0] in ("Z", "X") or stat_[3] != ns.get("init_starttime"):
        return None
    ours = (supervisor_proc.pidns_of(os.getpid()), supervisor_proc.pidns_of(1))
    if supervisor_proc.pidns_of(init) != pidns or pidns in ours:
        return None  # never our own namespace, whatever the record says
    return pidns


def sandbox_processes(sandbox_id: str, control: Path, path: Path) -> set[int]:
    """Roots of the sandbox's processes, found from what the play cannot change:
    the recorded supervisor and PID-namespace init (checked by start time), every
    process in that PID namespace while its init lives, whatever runs its supervisor or
    bwrap (by command line), plus, in process mode, anything started with the sandbox's
    HOME (a play's processes reparented away after its supervisor was killed)."""
    recorded: set[int] = set()
    for name, pid_key, start_key in ((PROC_FILE, "pid", "starttime"),
                                     (supervisor_proc.NS_FILE, "init_pid", "init_starttime")):
        record = read_json(control / name) or {}
        pid = record.get(pid_key)
        if isinstance(pid, int):
            stat_ = supervisor_proc.read_stat(pid)
            if stat_ is not None and stat_[3] == record.get(start_key):
                recorded.add(pid)
    ns = read_json(control / supervisor_proc.NS_FILE) or {}
    strict = (read_json(control / META_FILE) or {}).get("isolation") == "strict"

    def scan(pidns: int | None) -> set[int]:
        return recorded | find_processes(
            str(control / SUPERVISOR_FILE),
            supervisor_strict.BWRAP_MARK + sandbox_id,
            None if strict else b"HOME=" + os.fsencode(path),
            pidns,
        )

    pidns = live_pidns(ns)
    found = scan(pidns)
    if pidns is not None and live_pidns(ns) is None:
        # The init died during the scan: its number may name a newer sandbox's namespace
        # by now. Its own namespace's processes die with the init (the kernel kills them).
        found = scan(None)
    return found


def _gone(record: dict[str, object], pid_key: str, start_key: str) -> bool:
    """The recorded process has exited (or its pid now names another process)."""
    pid = record.get(pid_key)
    if not isinstance(pid, int) or record.get(start_key) is None:
        return False
    stat_ = supervisor_proc.read_stat(pid)
    return stat_ is None or stat_[3] != record.get(start_key) or stat_[0] in ("Z", "X")


def namespace_gone(control: Path, ns: dict[str, object]) -> bool:
    """Nothing of the sandbox can be alive: it ran in its own PID namespace whose init has
    exited, and the kernel SIGKILLs every member with it. Spares a sandbox that ended
    normally the /proc scans (their cost grows with every process on the host)."""
    proc = read_json(control / PROC_FILE) or {}
    if not _gone(proc, "pid", "starttime"):
        return False
    if proc.get("isolation") == "strict":
        # bwrap itself lives outside the namespace and exits a moment after its init.
        outer_gone = ns.get("bwrap_starttime") is None or _gone(ns, "bwrap_pid", "bwrap_starttime")
        return _gone(ns, "init_pid", "init_starttime") and outer_gone
    # unshare --fork --kill-child: its child is the namespace's init and dies with it, but
    # a moment later (a parent-death signal). Only a supervisor that ended normally (its
    # exit record) waited for that; after one killed, the scan finds what is still dying.
    return proc.get("pid_namespace") is True and (control / supervisor_proc.EXIT_FILE).exists()


def _kill_recorded(control: Path, ns: dict[str, object]) -> None:
    """SIGKILL the recorded supervisor (or its unshare) and namespace init, each checked by
    start time so a reused pid is never hit."""
    for record, pid_key, start_key in ((read_json(control / PROC_FILE) or {}, "pid", "starttime"),
                                       (ns, "init_pid", "init_starttime"),
                                       (ns, "bwrap_pid", "bwrap_starttime")):
        pid = record.get(pid_key)
        if not isinstance(pid, int):
            continue
        stat_ = supervisor_proc.read_stat(pid)
        if stat_ is not None and stat_[3] == record.get(start_key):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def kill_sandbox(sandbox_id: str, control: Path, path: Path) -> None:
    """SIGKILL the sandbox's whole process tree and wait (DELETE_WAIT_S) for it to die."""
    ns = read_json(control / supervisor_proc.NS_FILE) or {}
    cgroup = Path(ns["cgroup"]) if isinstance(ns.get("cgroup"), str) else None
    if cgroup is not None:
        supervisor_limits.cgroup_kill(cgroup)
    if (control / supervisor_proc.EXIT_FILE).exists() and not namespace_gone(control, ns):
        # The supervisor writes its exit record after killing all the play ran: only it
        # (and bwrap's init, or unshare) can be left, finishing. Kill those, not scan /proc.
        _kill_recorded(control, ns)
        deadline = time.monotonic() + EXITING_WAIT_S
        while not namespace_gone(control, ns) and time.monotonic() < deadline:
            reap_children()
            time.sleep(POLL_INTERVAL_S / 2)
    if namespace_gone(control, ns):
        reap_children()
        if cgroup is not None:
            supervisor_limits.cgroup_kill(cgroup)  # now empty: removed
        return
    init = ns.get("init_pid")
    if isinstance(init, int):
        stat_ = supervisor_proc.read_stat(init)
        if stat_ is not None and stat_[3] == ns.get("init_starttime"):
            # The namespace's init: the kernel kills everything in it with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(init, signal.SIGKILL)
    killed = supervisor_proc.kill_tree(sandbox_processes(sandbox_id, control, path))
    deadline = time.monotonic() + DELETE_WAIT_S
    while True:
        reap_children()
        survivors = {pid for pid in killed if is_live(pid)}
        if not survivors:
            if cgroup is not None:
                supervisor_limits.cgroup_kill(cgroup)  # now empty: removed
            return
        if time.monotonic() >= deadline:
            raise ProviderError(f"sandbox {sandbox_id}: pids {sorted(survivors)} survived")
        time.sleep(POLL_INTERVAL_S)
