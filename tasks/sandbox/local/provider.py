"""The `local` provider: one directory and one supervised process tree per sandbox.

Stateless across processes: everything needed to poll or delete a sandbox lives in its
control record (tasks/sandbox/local/records.py), so a worker other than the one that
started a sandbox can inspect and remove it.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from tasks.sandbox import supervisor_proc, supervisor_strict
from tasks.sandbox.base import (
    CapacityUnavailableError,
    ExitReport,
    FileRead,
    ProcessStatus,
    ProviderError,
    SandboxNotFoundError,
    SandboxRef,
    SandboxSpec,
    TransportError,
)
from tasks.sandbox.local.config import BASE_ENV, exec_config, expand_argv, sandbox_env
from tasks.sandbox.local.isolation import Isolation, resolve_isolation
from tasks.sandbox.local.paths import read_under, safe_parts
from tasks.sandbox.local.processes import (
    abandon_child,
    kill_sandbox,
    pid_namespace_command,
    reap_children,
    sandbox_processes,
    track_child,
)
from tasks.sandbox.local.records import (
    CONTROL_ROOT,
    META_FILE,
    PROC_FILE,
    SUPERVISOR_FILE,
    SUPERVISOR_FILES,
    VISIBLE_CONTROL_FILES,
    exit_status,
    read_json,
    remove_tree,
    sweep_leftover,
    top_alive,
)
from tasks.sandbox.local.strict import (
    GATEWAY_SOCKET_ENV,
    gateway_socket_dir,
    host_layout,
    strict_config,
)
from tasks.settings import Settings, get_settings


class LocalProvider:
    """Sandboxes as directories under `root`, each run by a supervisor process tree."""

    name = "local"
    id_prefix = "lsb"
    reports_exit = True  # the supervisor reports the runner's exit (supervisor_report.py)

    def __init__(
        self,
        root: Path,
        *,
        pid_namespace: bool | None = None,
        isolation: Literal["auto", "strict", "process"] | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.root = Path(root)
        self.control_root = self.root / CONTROL_ROOT
        # None: use a PID namespace when the machine allows it; False forces process groups.
        self._pid_namespace = pid_namespace
        # None: PLAYRUN_SANDBOX_ISOLATION; resolved (and probed) at the first create.
        self._isolation_wanted = isolation
        self._isolation: Isolation | None = None
        self._settings = settings
        self._id_re = re.compile(rf"^{re.escape(self.id_prefix)}-[0-9a-f]{{16}}$")

    @property
    def settings(self) -> Settings:
        return self._settings or get_settings()

    @property
    def isolation(self) -> Isolation:
        """The mode new sandboxes get (probed once per process when not `process`)."""
        if self._isolation is None:
            if self._pid_namespace is not None and self._isolation_wanted is None:
                self._isolation_wanted = "process"  # the caller asked for a process layout
            self._isolation = resolve_isolation(self.settings, self.root,
                                                self._isolation_wanted)
        return self._isolation

    # --- paths and metadata -----------------------------------------------------------

    def _path(self, sandbox_id: str) -> Path | None:
        return self.root / sandbox_id if self._id_re.match(sandbox_id) else None

    def _control(self, sandbox_id: str) -> Path | None:
        """The control record, outside the sandbox's directory."""
        if not self._id_re.match(sandbox_id):
            return None
        outside = self.control_root / sandbox_id
        return outside if (outside / META_FILE).is_file() else None

    def _existing(self, sandbox_id: str) -> tuple[Path, Path]:
        """(control record, sandbox directory); the directory may be gone."""
        control = self._control(sandbox_id)
        path = self._path(sandbox_id)
        if control is None or path is None:
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r}")
        return control, path

    def _ref(self, sandbox_id: str, meta: Mapping[str, Any]) -> SandboxRef:
        labels = {str(k): str(v) for k, v in dict(meta.get("labels") or {}).items()}
        return SandboxRef(self.name, sandbox_id, labels, float(meta.get("created_at", 0.0)))

    # --- the interface ----------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxRef:
        # Keyed by the attempt: a create retried after a crash finds its own sandbox.
        digest = hashlib.sha256(spec.key.encode()).hexdigest() if spec.key else None
        sandbox_id = f"{self.id_prefix}-{(digest or secrets.token_hex(8))[:16]}"
        if digest and (control := self._control(sandbox_id)) is not None:
            return self._ref(sandbox_id, read_json(control / META_FILE) or {})
        isolation = self.isolation
        settings = self.settings
        labels = {str(k): str(v) for k, v in spec.labels.items()}
        meta = {
            "provider": self.name,
            "labels": labels,
            "created_at": time.time(),
            "isolation": isolation,
            "memory_mb": int(spec.memory_mb),
            "max_file_mb": int(spec.max_file_mb),
            "cpu_seconds": spec.cpu_seconds,
            "max_processes": int(spec.max_processes or settings.sandbox_max_processes),
            "max_dir_mb": int(spec.max_dir_mb or settings.sandbox_max_dir_mb),
        }
        owner = (settings.sandbox_uid, settings.sandbox_gid)
        published = False
        chown = isolation == "strict" and os.geteuid() == 0
        # Built under temporary names and renamed: the directory first, then the control
        # record (what list() and GC see), then the directory into place.
        tmp = self.root / f".creating-{sandbox_id}"
        ctl_tmp = self.control_root / f".creating-{sandbox_id}"
        control = self.control_root / sandbox_id
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.control_root.mkdir(exist_ok=True, mode=0o700)
            tmp.mkdir(mode=0o700)
            tmp.chmod(0o700)
            for rel, content in spec.files.items():
                parts = safe_parts(rel)
                if parts[0] == supervisor_proc.CONTROL_DIR:
                    raise ProviderError(f"{rel!r} is reserved for the provider")
                target = tmp.joinpath(*parts)
                if len(parts) > 1:  # top-level files (most) go straight into tmp
                    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                target.write_bytes(content)
            if chown:  # the play's host uid owns its directory and nothing else
                for dirpath, dirnames, filenames in os.walk(tmp):
                    os.chown(dirpath, *owner)
                    for name in dirnames + filenames:
                        os.chown(os.path.join(dirpath, name), *owner, follow_symlinks=False)
            ctl_tmp.mkdir(mode=0o700)
            for name, source in SUPERVISOR_FILES.items():
                (ctl_tmp / name).write_bytes(source)
                (ctl_tmp / name).chmod(0o600)
            # Not fsynced: the renames that publish it are not either, and no sandbox process
            # outlives a power loss; what must survive one is the process record (exec).
            supervisor_proc.write_atomic(
                ctl_tmp / META_FILE, json.dumps(meta).encode(), durable=False
            )
            ctl_tmp.rename(control)
            published = True
            tmp.rename(self.root / sandbox_id)
        except FileExistsError as exc:
            # The same key's create runs elsewhere: what it builds is its own to clean.
            raise TransportError(f"a create of sandbox {sandbox_id} is in progress") from exc
        except OSError as exc:
            for leftover in (tmp, ctl_tmp, *((control,) if published else ())):
                shutil.rmtree(leftover, ignore_errors=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                # No room for a sandbox is this host's capacity, not a broken start: the run
                # is deferred (nothing ran yet) and may start once space is freed.
                raise CapacityUnavailableError(f"no space for a sandbox: {exc}") from exc
            raise ProviderError(f"cannot create sandbox: {exc}") from exc
        except ProviderError:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(ctl_tmp, ignore_errors=True)
            raise
        return self._ref(sandbox_id, meta)

    def exec_detached(self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str],
                      timeout_s: float, report: ExitReport | None = None) -> None:
        control, path = self._existing(sandbox_id)
        if not path.is_dir():
            raise SandboxNotFoundError(f"sandbox {sandbox_id} has no directory")
        if (control / PROC_FILE).exists():
            raise ProviderError(f"sandbox {sandbox_id} already has a process")
        if not argv or timeout_s <= 0:
            raise ProviderError("exec_detached needs an argv and a positive timeout")
        meta = read_json(control / META_FILE) or {}
        strict = meta.get("isolation") == "strict"
        python = host_layout().python if strict else sys.executable
        settings = self.settings
        child_env = sandbox_env(env, supervisor_strict.SANDBOX_DEST if strict else str(path))
        max_file_mb = int(meta.get("max_file_mb", 64))
        strict_part: dict[str, Any] | None = None
        prefix: list[str] = []
        if strict:
            gateway_dir, socket_name = gateway_socket_dir(child_env, settings)
            if GATEWAY_SOCKET_ENV in child_env:
                child_env[GATEWAY_SOCKET_ENV] = f"{supervisor_strict.GATEWAY_DEST}/{socket_name}"
            strict_part = strict_config(
                settings, sandbox_id, path, gateway_dir,
                int(meta.get("max_processes") or settings.sandbox_max_processes), max_file_mb,
                int(meta.get("memory_mb", 1024)),
            )
        else:
            use_ns = self._pid_namespace is not False
            prefix = pid_namespace_command() if use_ns else []
            if self._pid_namespace and not prefix:
                raise ProviderError("a PID namespace was required but is not available here")
        config = exec_config(
            expand_argv(argv, python), child_env, timeout_s,
            memory_mb=meta.get("memory_mb", 1024), max_file_mb=max_file_mb,
            cpu_seconds=meta.get("cpu_seconds"), max_dir_mb=meta.get("max_dir_mb"),
            strict=strict_part, report=report, nice=settings.sandbox_nice,
        )
        supervisor_path = control / SUPERVISOR_FILE
        cmd = [sys.executable, "-I", str(supervisor_path), str(control), str(path)]
        # The supervisor's own environment has no token: the config arrives on its stdin.
        sup_env = dict(BASE_ENV, HOME=str(path))
        proc: subprocess.Popen[bytes] | None = None
        handing = False  # from the config write on, the supervisor may run the play
        try:
            console = os.open(
                control / supervisor_proc.CONSOLE_FILE,
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                0o600,
            )
            try:
                reap_children()
                proc = subprocess.Popen(
                    prefix + cmd,
                    cwd=control if strict else path,
                    env=sup_env,
                    stdin=subprocess.PIPE,
                    stdout=console,
                    stderr=console,
                    start_new_session=True,
                    close_fds=True,
                )
            finally:
                os.close(console)
            track_child(proc)
            stat_ = supervisor_proc.read_stat(proc.pid)
            record = {
                "pid": proc.pid,
                "starttime": stat_[3] if stat_ else None,
                "pid_namespace": bool(prefix) or strict,
                "isolation": "strict" if strict else "process",
                "started_at": time.time(),
            }
            supervisor_proc.write_atomic(control / PROC_FILE, json.dumps(record).encode())
            assert proc.stdin is not None
            handing = True
            try:
                proc.stdin.write(json.dumps(config).encode())
            finally:
                proc.stdin.close()
        except OSError as exc:
            if handing:
                raise ProviderError(f"cannot start sandbox {sandbox_id}: {exc}") from exc
            if proc is not None:
                abandon_child(proc, control)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                # A disk that filled up after create is capacity, as it is for create:
                # nothing ran (no config was handed over), so the start may be deferred.
                raise CapacityUnavailableError(
                    f"no space to start sandbox {sandbox_id}: {exc}") from exc
            raise ProviderError(f"cannot start sandbox {sandbox_id}: {exc}") from exc

    def poll(self, sandbox_id: str) -> ProcessStatus:
        control, _ = self._existing(sandbox_id)
        reap_children()
        status = exit_status(control)
        if status is not None:
            return status
        if top_alive(control):
            return ProcessStatus("running")
        # The supervisor may have written its record between the two checks.
        status = exit_status(control)
        if status is not None:
            return status
        # exec writes the process record before the supervisor gets its argv (on stdin),
        # so without one nothing of the play can have run (and a supervisor that never
        # got its argv says so in its exit record).
        exists = (control / PROC_FILE).exists()
        return ProcessStatus("missing" if exists else "never_started")

    def read_file(
        self, sandbox_id: str, path: str, *, offset: int = 0, max_bytes: int
    ) -> FileRead | None:
        control, base = self._existing(sandbox_id)
        parts = safe_parts(path)
        if offset < 0 or max_bytes < 0:
            raise ProviderError("offset and max_bytes must not be negative")
        if parts[0] == supervisor_proc.CONTROL_DIR:
            # The provider's own files (the console log) live in the control record.
            if len(parts) != 2 or parts[1] not in VISIBLE_CONTROL_FILES:
                return None
            base, parts = control, parts[1:]
        return read_under(base, parts, path, sandbox_id, offset, max_bytes)

    def _sandbox_processes(self, sandbox_id: str) -> set[int]:
        """Roots of the sandbox's processes (see processes.sandbox_processes)."""
        control = self._control(sandbox_id) or self.control_root / sandbox_id
        return sandbox_processes(sandbox_id, control, self.root / sandbox_id)

    def kill(self, sandbox_id: str) -> None:
        """SIGKILL the sandbox's whole process tree and wait for it to die; keeps the files.
        Works whether or not the sandbox's directory still exists."""
        if self._path(sandbox_id) is None:
            return
        control = self._control(sandbox_id) or self.control_root / sandbox_id
        kill_sandbox(sandbox_id, control, self.root / sandbox_id)

    def delete(self, sandbox_id: str) -> None:
        path = self._path(sandbox_id)
        if path is None:
            return
        control = self._control(sandbox_id)
        outside = self.control_root / sandbox_id
        if control is None and not path.exists() and not outside.exists():
            return
        self.kill(sandbox_id)
        # Renamed first so concurrent pollers see "not found" at once and deletes don't race;
        # the directory before the control record, so a crash in between leaves the record
        # (and GC deletes it again).
        token = secrets.token_hex(4)
        for src, doomed in ((path, self.root / f".deleting-{sandbox_id}-{token}"),
                            (outside, self.control_root / f".deleting-{sandbox_id}-{token}")):
            try:
                src.rename(doomed)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise ProviderError(f"cannot delete sandbox {sandbox_id}: {exc}") from exc
            remove_tree(doomed)

    def list(self, labels: Mapping[str, str]) -> builtins.list[SandboxRef]:
        """Sandboxes by label, from their control records: a sandbox whose directory is gone
        is still listed (so GC deletes it and kills what it left running)."""
        wanted = {str(k): str(v) for k, v in labels.items()}
        refs: dict[str, SandboxRef] = {}
        now = time.time()
        for base in (self.control_root, self.root):
            try:
                entries = builtins.list(os.scandir(base))
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.name.startswith((".creating-", ".deleting-", ".probe-")):
                    sweep_leftover(entry, now)
                    continue
                if not self._id_re.match(entry.name) or entry.name in refs:
                    continue
                control = self._control(entry.name)
                meta = read_json(control / META_FILE) if control else None
                if meta is None:
                    continue
                ref = self._ref(entry.name, meta)
                if all(ref.labels.get(k) == v for k, v in wanted.items()):
                    refs[entry.name] = ref
        return sorted(refs.values(), key=lambda r: (r.created_at, r.sandbox_id))

