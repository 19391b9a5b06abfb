"""The first process of a local sandbox: limits, starts and times one child, records its exit.

Standard library only: the local provider copies this file into the sandbox's control
directory (outside the sandbox) and runs it as ``python -I <control>/supervisor.py <control>
<sandbox>``, handing it the exec config (argv, env, limits) on stdin, so the env and its
token are never written to disk. In `process` isolation it runs inside the sandbox's PID
namespace (or as a subreaper) on the host filesystem; in `strict` isolation it stays on the
host and runs the child under bubblewrap, so nothing the play does can touch its timer, its
records or its console log. The provider also imports the /proc helpers below so
process-tree handling lives in one place.

It stays one file, longer than the ~400-line rule: `python -I` puts no directory on
sys.path, so it cannot import siblings, and a sandbox created by one release must run
under its own copy. What only the worker needs lives in tasks/sandbox/local/.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# The provider's files once lived in this directory inside the sandbox; the name stays
# reserved (read_file maps it onto the control directory) and legacy sandboxes use it.
CONTROL_DIR = ".playrun"
EXEC_FILE = "exec.json"  # legacy: the config is handed over stdin now
EXIT_FILE = "exit.json"
NS_FILE = "ns.json"
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
    if not roots:
        return stopped
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


# --- strict isolation: the bubblewrap command line ---------------------------------------

BWRAP_MARK = "playrun-sandbox:"  # argv[0] of bwrap (and of the namespace's init)
SANDBOX_DEST = "/sandbox"
GATEWAY_DEST = "/run/playrun"
INNER_UID = 1000
INNER_GID = 1000
# In the supervisor's private mount namespace (root only), the binds' sources are mounted
# under STAGE so the unprivileged uid that runs bwrap can reach them (e.g. under /root).
STAGE = "/tmp"
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
INFO_WAIT_S = 10.0


def bwrap_command(
    strict: dict[str, Any],
    command: list[str],
    *,
    info_fd: int | None = None,
    block_fd: int | None = None,
    seccomp_fd: int | None = None,
    passwd_fd: int | None = None,
    group_fd: int | None = None,
) -> list[str]:
    """bwrap's argv (argv[0] is the marker; exec the `bwrap` path from the config).

    `strict` holds what the provider resolved: system read-only binds and symlinks,
    `binds` (sandbox dir, Python, gateway dir: staged when `run_as` is set), paths to
    hide under empty tmpfs (site-packages), `share_net`, `tmp_bytes` and `sandbox_id`.
    """
    staged = strict.get("run_as") is not None
    args = [
        BWRAP_MARK + str(strict["sandbox_id"]),
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--new-session",
        "--cap-drop", "ALL",
        "--uid", str(INNER_UID),
        "--gid", str(INNER_GID),
        "--hostname", "sandbox",
    ]
    if strict.get("share_net"):
        args.append("--share-net")
    for src, dest in strict.get("system", []):
        args += ["--ro-bind", str(src), str(dest)]
    for target, link in strict.get("symlinks", []):
        args += ["--symlink", str(target), str(link)]
    for i, bind in enumerate(strict.get("binds", [])):
        src = f"{STAGE}/{i}" if staged else str(bind["src"])
        args += ["--bind" if bind.get("rw") else "--ro-bind", src, str(bind["dest"])]
    for path in strict.get("masks", []):
        args += ["--perms", "0555", "--size", "4096", "--tmpfs", str(path)]
    tmp = str(int(strict.get("tmp_bytes", 64 << 20)))
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--size", tmp, "--tmpfs", "/tmp", "--size", tmp, "--tmpfs", "/dev/shm"]
    # Only the sandbox directory (and the size-capped /tmp, /dev/shm) stays writable.
    args += ["--remount-ro", "/dev"]
    if passwd_fd is not None and group_fd is not None:
        # Who uid 1000 is, for getpass/pwd users; written before / turns read-only.
        args += ["--perms", "0644", "--file", str(passwd_fd), "/etc/passwd",
                 "--perms", "0644", "--file", str(group_fd), "/etc/group"]
    args += ["--remount-ro", "/", "--chdir", SANDBOX_DEST]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    if block_fd is not None:
        args += ["--block-fd", str(block_fd)]
    return [*args, "--", *command]


# Syscalls a play never needs that widen the kernel surface it can reach (exploit
# favourites: io_uring, bpf, userfaultfd, perf, keys) or reach other processes (ptrace,
# process_vm_*, pidfd_getfd, kcmp); they fail with EPERM. x86_64 numbers only: on other
# architectures no filter is installed (said at start-up).
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
DENIED_SYSCALLS_X86_64 = {
    "ptrace": 101, "syslog": 103, "pivot_root": 155, "acct": 163, "mount": 165,
    "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "init_module": 175,
    "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212, "kexec_load": 246,
    "add_key": 248, "request_key": 249, "keyctl": 250, "perf_event_open": 298,
    "fanotify_init": 300, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "finit_module": 313,
    "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_getfd": 438,
    "mount_setattr": 442,
}


def seccomp_program() -> bytes | None:
    """A classic BPF seccomp filter for bwrap --seccomp, or None off x86_64."""
    if os.uname().machine != "x86_64":
        return None
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, errno_ret = 0x7FFF0000, 0x00050000
    eperm, enosys = errno_ret | 1, errno_ret | 38
    numbers = sorted(DENIED_SYSCALLS_X86_64.values())
    prog: list[tuple[int, int, int, int]] = [
        (ld_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, AUDIT_ARCH_X86_64),
        (ret, 0, 0, enosys),  # i386 compat calls: nothing
        (ld_abs, 0, 0, 0),  # seccomp_data.nr
        (jge, 0, 1, X32_SYSCALL_BIT),
        (ret, 0, 0, eperm),  # the x32 ABI: nothing
    ]
    deny_at = len(prog) + len(numbers) + 1
    for i, nr in enumerate(numbers):
        prog.append((jeq, deny_at - (len(prog)) - 1, 0, nr))
        assert i < 200
    prog += [(ret, 0, 0, allow), (ret, 0, 0, eperm)]
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


def data_fd(data: bytes) -> int:
    """A pipe's read end holding `data` (small: it must fit the pipe buffer)."""
    read_end, write_end = os.pipe()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(write_end, view):]
    finally:
        os.close(write_end)
    return read_end


PASSWD = f"sandbox:x:{INNER_UID}:{INNER_GID}:sandbox:{SANDBOX_DEST}:/bin/sh\n"
GROUP = f"sandbox:x:{INNER_GID}:\n"


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prepare_child(
    binds: list[dict[str, Any]], run_as: list[int] | None, limits: Any
) -> Any:
    """bwrap's preexec_fn: set the sandbox's rlimits (on bwrap and all it starts, not on
    this supervisor), and when root: mount the binds' sources under STAGE in a private
    mount namespace, then become `run_as` (uid, gid) for good. Single-threaded callers."""

    def preexec() -> None:
        try:
            limits()
            if run_as is None:
                return
            libc = ctypes.CDLL(None, use_errno=True)
            _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "private /")
            # Opened in this namespace, before STAGE is covered (a source may be under it).
            fds = [os.open(str(b["src"]), os.O_PATH | os.O_CLOEXEC) for b in binds]
            _check(
                libc.mount(b"tmpfs", STAGE.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                           b"mode=0755,size=64k"),
                f"tmpfs on {STAGE}",
            )
            for i, fd in enumerate(fds):
                target = f"{STAGE}/{i}"
                os.mkdir(target, 0o755)
                source = f"/proc/self/fd/{fd}".encode()
                _check(libc.mount(source, target.encode(), None, MS_BIND | MS_REC, None),
                       f"bind {binds[i]['src']}")
                os.close(fd)
            os.setgroups([])
            os.setresgid(run_as[1], run_as[1], run_as[1])
            os.setresuid(run_as[0], run_as[0], run_as[0])
        except BaseException as exc:
            os.write(2, f"supervisor: cannot prepare the sandbox: {exc}\n".encode())
            raise

    return preexec


def read_info(fd: int, within: float = INFO_WAIT_S) -> dict[str, Any] | None:
    """bwrap's --info-fd document (written once its namespaces exist), or None at EOF."""
    data = b""
    deadline = time.monotonic() + within
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
        if data.rstrip().endswith(b"}"):
            try:
                value = json.loads(data)
            except ValueError:
                continue
            return value if isinstance(value, dict) else None
    return None


# --- cgroup v2 (where a delegated hierarchy is available) -------------------------------

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


def cgroup_kill(path: Path) -> None:
    """Kill everything in the cgroup (cgroup.kill, Linux 5.14+) and remove it if empty."""
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    with contextlib.suppress(OSError):
        path.rmdir()


# --- the supervisor itself -------------------------------------------------------------

# The directory's size is checked this often at most; a walk that takes longer spaces the
# checks out so the supervisor spends at most ~2% of a CPU on them.
DISK_CHECK_S = 0.1
DISK_CHECK_COST_FACTOR = 50
DISK_MAX_ENTRIES = 100_000


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


class _Strict:
    """The bwrap child of a strict sandbox and its PID namespace's init (outer pid)."""

    cgroup: Path | None

    def __init__(self, strict: dict[str, Any], argv: list[str], env: dict[str, str],
                 out_fd: int, control: Path, limits: Any) -> None:
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        command = [*strict.get("prefix", []), *argv]
        run_as = strict.get("run_as")
        preexec = prepare_child(list(strict.get("binds", [])),
                                [int(x) for x in run_as] if run_as else None, limits)
        program = seccomp_program() if strict.get("seccomp", True) else None
        fds = {"info_fd": info_w, "block_fd": block_r,
               "passwd_fd": data_fd(PASSWD.encode()), "group_fd": data_fd(GROUP.encode())}
        if program is not None:
            fds["seccomp_fd"] = data_fd(program)
        try:
            proc = subprocess.Popen(
                bwrap_command(strict, command, **fds),
                executable=str(strict["bwrap"]),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out_fd,
                stderr=out_fd,
                pass_fds=tuple(fds.values()),
                preexec_fn=preexec,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            for fd in fds.values():
                os.close(fd)
        self.pid = proc.pid
        self.cgroup = None
        self.init_pid: int | None = None
        self.init_start: int | None = None
        try:
            info = read_info(info_r)
            if info is None or not isinstance(info.get("child-pid"), int):
                return  # bwrap failed before its namespaces existed; its exit says why
            self.init_pid = int(info["child-pid"])
            stat = read_stat(self.init_pid)
            self.init_start = stat[3] if stat else None
            cgroup = strict.get("cgroup")
            if cgroup:
                try:
                    applied = cgroup_enter(Path(cgroup["path"]), dict(cgroup["limits"]),
                                           self.init_pid)
                    self.cgroup = Path(cgroup["path"])
                    os.write(out_fd, f"supervisor: cgroup {', '.join(applied)}\n".encode())
                except OSError as exc:
                    os.write(out_fd, f"supervisor: no cgroup limits: {exc}\n".encode())
            record = {
                "init_pid": self.init_pid,
                "init_starttime": self.init_start,
                "pidns": info.get("pid-namespace") or pidns_of(self.init_pid),
                "bwrap_pid": self.pid,
                "cgroup": str(self.cgroup) if self.cgroup else None,
            }
            # Not fsynced: a power loss ends the namespace and everything in it.
            write_atomic(control / NS_FILE, json.dumps(record).encode(), durable=False)
            os.write(block_w, b"1")  # recorded: now let the command start
        finally:
            os.close(info_r)
            os.close(block_w)

    def kill(self, *, reaped: bool = False) -> None:
        """SIGKILL the namespace's init (the kernel then kills everything in it), and bwrap
        unless it was reaped already (its pid may belong to someone else by now)."""
        if self.init_pid is not None:
            stat = read_stat(self.init_pid)
            if stat is not None and stat[3] == self.init_start:
                _signal(self.init_pid, signal.SIGKILL)
        if self.cgroup is not None:
            cgroup_kill(self.cgroup)
        if not reaped:
            kill_tree([self.pid])


def _read_config(control: Path) -> dict[str, Any] | None:
    """The exec config from stdin; None if the launcher died before handing it over
    whole (it writes the process record first, so that case must be told apart)."""
    data = sys.stdin.buffer.read()
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    if not data:  # a legacy sandbox: the config was written next to us
        try:
            data = (control / EXEC_FILE).read_bytes()
        except FileNotFoundError:
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
    record = {"exit_code": None, "timed_out": False, "limit": None, "never_started": True,
              "finished_at": time.time()}
    write_atomic(control / EXIT_FILE, json.dumps(record).encode())
    return 0


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
        _apply_limits(config, timeout_s)
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
    strict: _Strict | None = None
    try:
        if strict_cfg is not None:
            strict = _Strict(strict_cfg, argv, env, write_fd, control,
                             lambda: _apply_limits(config, timeout_s))
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
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 2:  # legacy layout: <sandbox>, control inside it
        sys.exit(supervise(Path(sys.argv[1]) / CONTROL_DIR, Path(sys.argv[1])))
    sys.exit(supervise(Path(sys.argv[1]), Path(sys.argv[2])))
