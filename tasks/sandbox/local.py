"""The `local` provider: one directory and one supervised process tree per sandbox.

Stateless across processes: everything needed to poll or delete a sandbox (labels, limits,
the top pid and its start time, the exit record) lives in the sandbox's `.playrun` directory,
so a worker other than the one that started a sandbox can inspect and remove it.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from tasks.sandbox import supervisor as sup
from tasks.sandbox.base import (
    FileRead,
    ProcessStatus,
    ProviderError,
    SandboxNotFoundError,
    SandboxRef,
    SandboxSpec,
)

META_FILE = "meta.json"
PROC_FILE = "proc.json"
SUPERVISOR_FILE = "supervisor.py"
PYTHON_PLACEHOLDER = "{python}"
# "{python}" as argv[0] runs like -I minus -P: no user site, no PYTHON* variables, no .pyc
# writes into the shared venv; the sandbox dir stays importable for multi-file bundles.
PYTHON_FLAGS = ("-s", "-E", "-B", "-u")
BASE_ENV: Mapping[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}
DELETE_WAIT_S = 2.0
POLL_INTERVAL_S = 0.01
# Half-created or half-deleted directories left by a crash are swept after this long.
STALE_TMP_S = 600.0
_SUPERVISOR_SOURCE = Path(sup.__file__).read_bytes()

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


def _reap_children() -> None:
    with _children_lock:
        for pid, proc in builtins.list(_children.items()):
            if proc.poll() is not None:
                del _children[pid]


def _safe_parts(path: str) -> tuple[str, ...]:
    """Components of a sandbox-relative path; refuses absolute paths and any '..'."""
    if not path or "\0" in path:
        raise ProviderError(f"invalid sandbox path {path!r}")
    pure = PurePosixPath(path)
    parts = tuple(p for p in pure.parts if p != ".")
    if pure.is_absolute() or not parts or ".." in parts:
        raise ProviderError(f"path {path!r} escapes the sandbox")
    return parts


class LocalProvider:
    """Sandboxes as directories under `root`, each run by a supervisor process tree."""

    name = "local"
    id_prefix = "lsb"

    def __init__(self, root: Path, *, pid_namespace: bool | None = None) -> None:
        self.root = Path(root)
        # None: use a PID namespace when the machine allows it; False forces process groups.
        self._pid_namespace = pid_namespace
        self._id_re = re.compile(rf"^{re.escape(self.id_prefix)}-[0-9a-f]{{16}}$")

    # --- paths and metadata -----------------------------------------------------------

    def _path(self, sandbox_id: str) -> Path | None:
        return self.root / sandbox_id if self._id_re.match(sandbox_id) else None

    def _existing(self, sandbox_id: str) -> Path:
        path = self._path(sandbox_id)
        if path is None or not (path / sup.CONTROL_DIR / META_FILE).is_file():
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r}")
        return path

    @staticmethod
    def _read_json(path: Path) -> dict[str, Any] | None:
        try:
            value = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def _ref(self, sandbox_id: str, meta: Mapping[str, Any]) -> SandboxRef:
        labels = {str(k): str(v) for k, v in dict(meta.get("labels") or {}).items()}
        return SandboxRef(self.name, sandbox_id, labels, float(meta.get("created_at", 0.0)))

    # --- the interface ----------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxRef:
        sandbox_id = f"{self.id_prefix}-{secrets.token_hex(8)}"
        labels = {str(k): str(v) for k, v in spec.labels.items()}
        meta = {
            "provider": self.name,
            "labels": labels,
            "created_at": time.time(),
            "memory_mb": int(spec.memory_mb),
            "max_file_mb": int(spec.max_file_mb),
            "cpu_seconds": spec.cpu_seconds,
        }
        # Built under a temporary name and renamed: a sandbox is listed whole or not at all.
        tmp = self.root / f".creating-{sandbox_id}"
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp.mkdir(mode=0o700)
            tmp.chmod(0o700)
            for rel, content in spec.files.items():
                parts = _safe_parts(rel)
                if parts[0] == sup.CONTROL_DIR:
                    raise ProviderError(f"{rel!r} is reserved for the provider")
                target = tmp.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                target.write_bytes(content)
            control = tmp / sup.CONTROL_DIR
            control.mkdir(mode=0o700)
            (control / SUPERVISOR_FILE).write_bytes(_SUPERVISOR_SOURCE)
            sup.write_atomic(control / META_FILE, json.dumps(meta).encode())
            tmp.rename(self.root / sandbox_id)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ProviderError(f"cannot create sandbox: {exc}") from exc
        except ProviderError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self._ref(sandbox_id, meta)

    def exec_detached(
        self,
        sandbox_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        timeout_s: float,
    ) -> None:
        path = self._existing(sandbox_id)
        control = path / sup.CONTROL_DIR
        if (control / PROC_FILE).exists():
            raise ProviderError(f"sandbox {sandbox_id} already has a process")
        if not argv or timeout_s <= 0:
            raise ProviderError("exec_detached needs an argv and a positive timeout")
        meta = self._read_json(control / META_FILE) or {}
        expanded: list[str] = []
        for i, arg in enumerate(argv):
            if arg == PYTHON_PLACEHOLDER:
                expanded.append(sys.executable)
                if i == 0:
                    expanded.extend(PYTHON_FLAGS)
            else:
                expanded.append(str(arg))
        config = {
            "argv": expanded,
            "timeout_s": float(timeout_s),
            "memory_mb": meta.get("memory_mb", 1024),
            "max_file_mb": meta.get("max_file_mb", 64),
            "cpu_seconds": meta.get("cpu_seconds"),
        }
        # Nothing of the worker's environment leaks in: only the base and the caller's env.
        child_env = dict(BASE_ENV)
        child_env.update({str(k): str(v) for k, v in env.items()})
        # Not overridable: delete finds orphaned sandbox processes by this exact entry.
        child_env["HOME"] = str(path)
        supervisor_path = control / SUPERVISOR_FILE
        cmd = [sys.executable, "-I", str(supervisor_path), str(path)]
        use_ns = self._pid_namespace is not False
        prefix = pid_namespace_command() if use_ns else []
        if self._pid_namespace and not prefix:
            raise ProviderError("a PID namespace was required but is not available here")
        try:
            sup.write_atomic(control / sup.EXEC_FILE, json.dumps(config).encode())
            console = os.open(
                control / sup.CONSOLE_FILE,
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                0o600,
            )
            try:
                _reap_children()
                proc = subprocess.Popen(
                    prefix + cmd,
                    cwd=path,
                    env=child_env,
                    stdin=subprocess.DEVNULL,
                    stdout=console,
                    stderr=console,
                    start_new_session=True,
                    close_fds=True,
                )
            finally:
                os.close(console)
            with _children_lock:
                _children[proc.pid] = proc
            stat_ = sup.read_stat(proc.pid)
            record = {
                "pid": proc.pid,
                "starttime": stat_[3] if stat_ else None,
                "pid_namespace": bool(prefix),
                "started_at": time.time(),
            }
            sup.write_atomic(control / PROC_FILE, json.dumps(record).encode())
        except OSError as exc:
            raise ProviderError(f"cannot start sandbox {sandbox_id}: {exc}") from exc

    def _top_alive(self, path: Path) -> bool:
        """The recorded top process is alive and really is this sandbox's (not a reused pid)."""
        record = self._read_json(path / sup.CONTROL_DIR / PROC_FILE)
        if record is None or not isinstance(record.get("pid"), int):
            return False
        pid = record["pid"]
        stat_ = sup.read_stat(pid)
        if stat_ is None or stat_[0] in ("Z", "X") or stat_[3] != record.get("starttime"):
            return False
        return str(path / sup.CONTROL_DIR / SUPERVISOR_FILE) in sup.read_cmdline(pid)

    def _exit_status(self, path: Path) -> ProcessStatus | None:
        record = self._read_json(path / sup.CONTROL_DIR / sup.EXIT_FILE)
        if record is None:
            return None
        code = record.get("exit_code")
        return ProcessStatus(
            "exited", code if isinstance(code, int) else None, bool(record.get("timed_out"))
        )

    def poll(self, sandbox_id: str) -> ProcessStatus:
        path = self._existing(sandbox_id)
        _reap_children()
        status = self._exit_status(path)
        if status is not None:
            return status
        if self._top_alive(path):
            return ProcessStatus("running")
        # The supervisor may have written its record between the two checks.
        return self._exit_status(path) or ProcessStatus("missing")

    def read_file(
        self, sandbox_id: str, path: str, *, offset: int = 0, max_bytes: int
    ) -> FileRead | None:
        base = self._existing(sandbox_id)
        parts = _safe_parts(path)
        if offset < 0 or max_bytes < 0:
            raise ProviderError("offset and max_bytes must not be negative")
        try:
            fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r}") from exc
        try:
            # Walk component by component with O_NOFOLLOW: a play cannot redirect us
            # through a symlink (e.g. result.json -> a worker secret), even by racing.
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                flags |= os.O_NONBLOCK if last else os.O_DIRECTORY
                try:
                    next_fd = os.open(part, flags, dir_fd=fd)
                except FileNotFoundError:
                    return None
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise ProviderError(f"cannot read {path!r}: {exc}") from exc
                    if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                        raise ProviderError(f"{path!r} goes through a symlink") from exc
                    return None
                os.close(fd)
                fd = next_fd
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ProviderError(f"{path!r} is not a regular file")
            chunks: list[bytes] = []
            want, pos = max_bytes, offset
            while want > 0:
                chunk = os.pread(fd, min(want, 1 << 20), pos)
                if not chunk:
                    break
                chunks.append(chunk)
                want -= len(chunk)
                pos += len(chunk)
            data = b"".join(chunks)
            return FileRead(data, info.st_size, offset + len(data) < info.st_size)
        finally:
            os.close(fd)

    def _sandbox_processes(self, path: Path) -> set[int]:
        """Roots of the sandbox's processes: whatever runs its supervisor (unshare included),
        plus anything started with the sandbox's HOME (the play's processes, even after its
        supervisor was killed and they were reparented away)."""
        marker = str(path / sup.CONTROL_DIR / SUPERVISOR_FILE)
        return sup.processes_matching(marker, b"HOME=" + os.fsencode(path))

    def kill(self, sandbox_id: str) -> None:
        """SIGKILL the sandbox's whole process tree and wait for it to die; keeps the files."""
        path = self._path(sandbox_id)
        if path is None or not path.exists():
            return
        killed = sup.kill_tree(self._sandbox_processes(path))
        deadline = time.monotonic() + DELETE_WAIT_S
        while True:
            _reap_children()
            survivors = {pid for pid in killed if sup.is_live(pid)}
            if not survivors:
                return
            if time.monotonic() >= deadline:
                raise ProviderError(f"sandbox {sandbox_id}: pids {sorted(survivors)} survived")
            time.sleep(POLL_INTERVAL_S)

    def delete(self, sandbox_id: str) -> None:
        path = self._path(sandbox_id)
        if path is None or not path.exists():
            return
        self.kill(sandbox_id)
        # Renamed first so concurrent pollers see "not found" at once and deletes don't race.
        doomed = self.root / f".deleting-{sandbox_id}-{secrets.token_hex(4)}"
        try:
            path.rename(doomed)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ProviderError(f"cannot delete sandbox {sandbox_id}: {exc}") from exc
        _remove_tree(doomed)

    def list(self, labels: Mapping[str, str]) -> builtins.list[SandboxRef]:
        wanted = {str(k): str(v) for k, v in labels.items()}
        refs: builtins.list[SandboxRef] = []
        try:
            entries = builtins.list(os.scandir(self.root))
        except FileNotFoundError:
            return refs
        now = time.time()
        for entry in entries:
            if entry.name.startswith((".creating-", ".deleting-")):
                try:
                    if now - entry.stat(follow_symlinks=False).st_mtime > STALE_TMP_S:
                        _remove_tree(Path(entry.path))
                except OSError:
                    pass
                continue
            if not self._id_re.match(entry.name):
                continue
            meta = self._read_json(Path(entry.path) / sup.CONTROL_DIR / META_FILE)
            if meta is None:
                continue
            ref = self._ref(entry.name, meta)
            if all(ref.labels.get(k) == v for k, v in wanted.items()):
                refs.append(ref)
        refs.sort(key=lambda r: (r.created_at, r.sandbox_id))
        return refs


def _remove_tree(path: Path) -> None:
    """rmtree that also removes entries a play made unwritable (chmod 000 directories)."""

    def fix(_func: Any, target: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(target), 0o700)
            if os.path.isdir(target) and not os.path.islink(target):
                os.chmod(target, 0o700)
                shutil.rmtree(target, ignore_errors=True)
            else:
                os.unlink(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix)
