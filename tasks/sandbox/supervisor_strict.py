"""Strict isolation: the bubblewrap command line, its seccomp filter, and the bwrap child of
a strict sandbox with its PID namespace's init.

Standard library only: copied beside supervisor.py into each control record.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import struct
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported by the worker as tasks.sandbox.*
    from tasks.sandbox.supervisor_limits import cgroup_enter, cgroup_kill
    from tasks.sandbox.supervisor_proc import (
        NS_FILE,
        kill_tree,
        pidns_of,
        read_stat,
        signal_quietly,
        write_atomic,
    )
else:  # run from the control record, where the supervisor's files sit flat
    from supervisor_limits import cgroup_enter, cgroup_kill
    from supervisor_proc import (
        NS_FILE,
        kill_tree,
        pidns_of,
        read_stat,
        signal_quietly,
        write_atomic,
    )

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
        "--cap-drop",
        "ALL",
        "--uid",
        str(INNER_UID),
        "--gid",
        str(INNER_GID),
        "--hostname",
        "sandbox",
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
        args += [
            "--perms",
            "0644",
            "--file",
            str(passwd_fd),
            "/etc/passwd",
            "--perms",
            "0644",
            "--file",
            str(group_fd),
            "/etc/group",
        ]
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
    "ptrace": 101,
    "syslog": 103,
    "pivot_root": 155,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "lookup_dcookie": 212,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "perf_event_open": 298,
    "fanotify_init": 300,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "pidfd_getfd": 438,
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
            view = view[os.write(write_end, view) :]
    finally:
        os.close(write_end)
    return read_end


PASSWD = f"sandbox:x:{INNER_UID}:{INNER_GID}:sandbox:{SANDBOX_DEST}:/bin/sh\n"
GROUP = f"sandbox:x:{INNER_GID}:\n"


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prepare_child(binds: list[dict[str, Any]], run_as: list[int] | None, limits: Any) -> Any:
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
                libc.mount(
                    b"tmpfs", STAGE.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=64k"
                ),
                f"tmpfs on {STAGE}",
            )
            for i, fd in enumerate(fds):
                target = f"{STAGE}/{i}"
                os.mkdir(target, 0o755)
                source = f"/proc/self/fd/{fd}".encode()
                _check(
                    libc.mount(source, target.encode(), None, MS_BIND | MS_REC, None),
                    f"bind {binds[i]['src']}",
                )
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


class StrictChild:
    """The bwrap child of a strict sandbox and its PID namespace's init (outer pid)."""

    cgroup: Path | None

    def __init__(
        self,
        strict: dict[str, Any],
        argv: list[str],
        env: dict[str, str],
        out_fd: int,
        control: Path,
        limits: Any,
    ) -> None:
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        command = [*strict.get("prefix", []), *argv]
        run_as = strict.get("run_as")
        preexec = prepare_child(
            list(strict.get("binds", [])), [int(x) for x in run_as] if run_as else None, limits
        )
        program = seccomp_program() if strict.get("seccomp", True) else None
        fds = {
            "info_fd": info_w,
            "block_fd": block_r,
            "passwd_fd": data_fd(PASSWD.encode()),
            "group_fd": data_fd(GROUP.encode()),
        }
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
                    applied = cgroup_enter(
                        Path(cgroup["path"]), dict(cgroup["limits"]), self.init_pid
                    )
                    self.cgroup = Path(cgroup["path"])
                    os.write(out_fd, f"supervisor: cgroup {', '.join(applied)}\n".encode())
                except OSError as exc:
                    os.write(out_fd, f"supervisor: no cgroup limits: {exc}\n".encode())
            record = {
                "init_pid": self.init_pid,
                "init_starttime": self.init_start,
                "pidns": info.get("pid-namespace") or pidns_of(self.init_pid),
                "bwrap_pid": self.pid,
                "bwrap_starttime": bwrap_stat[3] if (bwrap_stat := read_stat(self.pid)) else None,
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
                signal_quietly(self.init_pid, signal.SIGKILL)
        if self.cgroup is not None:
            cgroup_kill(self.cgroup)
        if not reaped:
            kill_tree([self.pid])
