"""The `local` provider: one directory and one supervised process tree per sandbox.

Stateless across processes: everything needed to poll or delete a sandbox (labels, limits,
the supervisor's pid and start time, the sandbox's PID namespace, the exit record, the
console log) lives in its control record `<root>/.control/<sandbox_id>/`, outside the
sandbox's directory, so a worker other than the one that started a sandbox can inspect and
remove it, and a play that deletes its own directory cannot make it unfindable.

Two isolation modes (`PLAYRUN_SANDBOX_ISOLATION`, see docs/design.md "Strict isolation"):
`strict` runs the command under bubblewrap (new user, mount, PID, IPC, UTS and network
namespaces; only the sandbox directory writable, at /sandbox; the gateway socket's
directory at /run/playrun); `process` runs it on the host filesystem in its own session
(and PID namespace where `unshare` works). `auto` is strict when a probe run works.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import json
import logging
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from tasks.errors import ConfigurationError
from tasks.sandbox import supervisor as sup
from tasks.sandbox.base import (
    CapacityUnavailableError,
    FileRead,
    ProcessStatus,
    ProviderError,
    SandboxNotFoundError,
    SandboxRef,
    SandboxSpec,
)
from tasks.settings import Settings, get_settings

log = logging.getLogger("playrun.sandbox")
Isolation = Literal["strict", "process"]

CONTROL_ROOT = ".control"  # <root>/.control/<sandbox_id>/: never inside a sandbox
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
# Files of the control record that read_file shows under ".playrun/" (the token never is).
VISIBLE_CONTROL_FILES = frozenset({sup.CONSOLE_FILE})
GATEWAY_SOCKET_ENV = "PLAYRUN_GATEWAY_SOCKET"
PROBE_TIMEOUT_S = 30.0
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


# --- strict isolation: what the host offers, and whether bubblewrap works here ------------


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


@dataclass(frozen=True)
class HostLayout:
    """What a strict sandbox sees of the host: resolved once per process."""

    python: str  # the base interpreter (never the venv's), resolved
    system: tuple[tuple[str, str], ...]  # read-only binds
    symlinks: tuple[tuple[str, str], ...]
    python_dirs: tuple[str, ...]  # the Python installation when it is not under /usr
    masks: tuple[str, ...]  # site-packages of the base installation, hidden under tmpfs
    prlimit: str | None


_layout: HostLayout | None = None


def host_layout() -> HostLayout:
    global _layout
    if _layout is not None:
        return _layout
    system: list[tuple[str, str]] = [("/usr", "/usr")]
    symlinks: list[tuple[str, str]] = []
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            symlinks.append((os.readlink(top), top))
        elif os.path.isdir(top):
            system.append((top, top))
    for name in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime"):
        if os.path.exists(name):
            system.append((name, name))
    bound = [dest for _, dest in system]
    python = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
    dirs: list[str] = []
    for candidate in (sys.base_prefix, sys.base_exec_prefix, sysconfig.get_config_var("LIBDIR"),
                      os.path.dirname(os.path.dirname(python))):
        if not candidate:
            continue
        real = os.path.realpath(str(candidate))
        if os.path.isdir(real) and not _under(real, bound + dirs):
            dirs = [d for d in dirs if not _under(d, [real])] + [real]
    masks: list[str] = []
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    base_vars = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    for candidate in (
        sysconfig.get_path("purelib", vars=base_vars),
        sysconfig.get_path("platlib", vars=base_vars),
        f"/usr/local/lib/{version}/dist-packages",
        f"/usr/local/lib/{version}/site-packages",
        "/usr/lib/python3/dist-packages",
    ):
        real = os.path.realpath(candidate)
        if os.path.isdir(real) and real not in masks and _under(real, bound + dirs):
            masks.append(real)
    prlimit = next((p for p in ("/usr/bin/prlimit",) if os.access(p, os.X_OK)), None)
    _layout = HostLayout(python, tuple(system), tuple(symlinks), tuple(dirs), tuple(masks),
                         prlimit)
    return _layout


def _gateway_dir(env: Mapping[str, str], settings: Settings) -> tuple[Path, str]:
    """(host directory of the gateway socket, socket file name)."""
    socket_path = Path(env.get(GATEWAY_SOCKET_ENV) or settings.gateway_socket)
    return socket_path.parent, socket_path.name


def strict_config(
    settings: Settings,
    sandbox_id: str,
    sandbox_dir: Path,
    gateway_dir: Path | None,
    max_processes: int,
    tmp_mb: int,
    memory_mb: int | None = None,
) -> dict[str, Any]:
    """The `strict` part of the supervisor's config: everything bwrap needs, resolved."""
    layout = host_layout()
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ProviderError("bubblewrap is not installed (no bwrap on PATH)")
    binds: list[dict[str, Any]] = [{"src": str(sandbox_dir), "dest": sup.SANDBOX_DEST, "rw": True}]
    binds += [{"src": d, "dest": d, "rw": False} for d in layout.python_dirs]
    if gateway_dir is not None:
        if not gateway_dir.is_dir():
            with contextlib.suppress(OSError):
                gateway_dir.mkdir(parents=True, mode=0o755)
        if gateway_dir.is_dir():
            # The directory, not the socket: a restarted gateway's new socket shows up too.
            binds.append({"src": str(gateway_dir), "dest": sup.GATEWAY_DEST, "rw": False})
    if layout.prlimit:
        prefix = [layout.prlimit, f"--nproc={max_processes}", "--"]
    else:
        prefix = [layout.python, "-I", "-S", "-c", sup.NPROC_PRELUDE, str(max_processes)]
    config: dict[str, Any] = {
        "bwrap": bwrap,
        "sandbox_id": sandbox_id,
        "system": [list(pair) for pair in layout.system],
        "symlinks": [list(pair) for pair in layout.symlinks],
        "binds": binds,
        "masks": list(layout.masks),
        "share_net": bool(settings.sandbox_network),
        "tmp_bytes": tmp_mb * 1024 * 1024,
        "run_as": [settings.sandbox_uid, settings.sandbox_gid] if os.geteuid() == 0 else None,
        "prefix": prefix,
        "cgroup": None,
    }
    base = cgroup_base(settings)[0] if memory_mb is not None else None
    if base is not None and memory_mb is not None:
        config["cgroup"] = {
            "path": str(base / sandbox_id),
            "limits": sup.cgroup_limits(memory_mb, max_processes, settings.sandbox_cpus),
        }
    return config


_probe_lock = threading.Lock()
_probes: dict[tuple[Any, ...], str | None] = {}  # key -> None (works) or why not


def _probe_key(settings: Settings, root: Path) -> tuple[Any, ...]:
    return (str(root), settings.sandbox_network, settings.sandbox_uid, settings.sandbox_gid,
            str(settings.gateway_socket), os.geteuid())


def probe_strict(settings: Settings, root: Path) -> str | None:
    """Run a trivial command through the real supervisor and bwrap, with the exact flags a
    sandbox gets. None if it worked, else what is missing. Once per process."""
    key = _probe_key(settings, root)
    with _probe_lock:
        if key not in _probes:
            _probes[key] = _run_probe(settings, root)
        return _probes[key]


def _run_probe(settings: Settings, root: Path) -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (no `bwrap` on PATH; apt-get install bubblewrap)"
    base = root / CONTROL_ROOT
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        work = Path(tempfile.mkdtemp(prefix=".probe-", dir=base))
    except OSError as exc:
        return f"cannot prepare a probe under {base}: {exc}"
    try:
        sandbox, control = work / "sandbox", work / "control"
        sandbox.mkdir(mode=0o700)
        control.mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(sandbox, settings.sandbox_uid, settings.sandbox_gid)
        gateway_dir, _ = _gateway_dir({}, settings)
        try:
            strict = strict_config(settings, "lsb-probe", sandbox, gateway_dir, 16, 1)
        except ProviderError as exc:
            return exc.message
        config = {
            "argv": [host_layout().python, "-I", "-S", "-c", "open('ok', 'w').write('ok')"],
            "env": dict(BASE_ENV),
            "timeout_s": PROBE_TIMEOUT_S,
            "memory_mb": 1024,
            "max_file_mb": 1,
            "cpu_seconds": None,
            "max_dir_mb": None,
            "strict": strict,
        }
        console = control / sup.CONSOLE_FILE
        with open(console, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-I", sup.__file__, str(control), str(sandbox)],
                stdin=subprocess.PIPE, stdout=out, stderr=out, env=dict(BASE_ENV),
                cwd=str(control), close_fds=True,
            )
            try:
                proc.communicate(json.dumps(config).encode(), timeout=PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return "the bubblewrap probe did not finish"
        exit_record = LocalProvider._read_json(control / sup.EXIT_FILE) or {}
        try:
            wrote = (sandbox / "ok").read_bytes() == b"ok"
        except OSError:
            wrote = False
        if exit_record.get("exit_code") == 0 and wrote:
            return None
        said = console.read_bytes().decode(errors="replace").strip()[-600:]
        return f"bubblewrap cannot run a sandbox here (exit {exit_record.get('exit_code')}): " + (
            said or "no output") + _userns_hint()
    finally:
        _remove_tree(work)


def _userns_hint() -> str:
    for knob, bad in (("/proc/sys/kernel/unprivileged_userns_clone", "0"),
                      ("/proc/sys/user/max_user_namespaces", "0"),
                      ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1")):
        try:
            if Path(knob).read_text().strip() == bad:
                return f"; unprivileged user namespaces are disabled ({knob} = {bad})"
        except OSError:
            continue
    return ""


def resolve_isolation(settings: Settings, root: Path, wanted: str | None = None) -> Isolation:
    """The mode sandboxes get: `strict` needs the probe to pass (ConfigurationError if not);
    `auto` falls back to `process`."""
    mode = wanted or settings.sandbox_isolation
    if mode == "process":
        return "process"
    problem = probe_strict(settings, root)
    if problem is None:
        return "strict"
    if mode == "strict":
        raise ConfigurationError(
            f"PLAYRUN_SANDBOX_ISOLATION=strict, but strict isolation does not work on this "
            f"machine: {problem}"
        )
    return "process"


def check_isolation(settings: Settings | None = None) -> str:
    """Start-up check for workers: the isolation mode local sandboxes will run in.

    Raises ConfigurationError when `strict` is configured and unavailable; logs the mode
    and what it applies either way.
    """
    settings = settings or get_settings()
    mode = resolve_isolation(settings, Path(settings.sandbox_root))
    if mode == "strict":
        log.info(
            "sandbox isolation: strict (bubblewrap: user/mount/pid/ipc/uts/net namespaces, "
            "seccomp %s, network %s, %s; rlimits: as %d MB, fsize %d MB, nproc %d; "
            "dir cap %d MB; cgroup v2 limits: %s)",
            "on" if sup.seccomp_program() else "off (not x86_64)",
            "shared" if settings.sandbox_network else "none but the gateway socket",
            f"host uid {settings.sandbox_uid}" if os.geteuid() == 0 else "the worker's uid",
            settings.sandbox_memory_mb, settings.sandbox_max_file_mb,
            settings.sandbox_max_processes, settings.sandbox_max_dir_mb,
            cgroup_base(settings)[1],
        )
    else:
        why = "" if settings.sandbox_isolation == "process" else (
            f" (strict unavailable: {probe_strict(settings, Path(settings.sandbox_root))})")
        log.warning("sandbox isolation: process%s; plays share the host filesystem "
                    "and network", why)
    return mode


CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_CONTROLLERS = ("cpu", "memory", "pids")
_cgroups: dict[tuple[str, int], tuple[Path | None, str]] = {}


def _enable_controllers(directory: Path) -> None:
    available = set((directory / "cgroup.controllers").read_text().split())
    missing = set(CGROUP_CONTROLLERS) - available
    if missing:
        raise OSError(f"controllers {sorted(missing)} not available in {directory}")
    enabled = set((directory / "cgroup.subtree_control").read_text().split())
    wanted = [f"+{c}" for c in CGROUP_CONTROLLERS if c not in enabled]
    if wanted:
        (directory / "cgroup.subtree_control").write_text(" ".join(wanted))


def cgroup_base(settings: Settings) -> tuple[Path | None, str]:
    """(the cgroup v2 directory sandboxes' cgroups go under, or None; what that means).
    Probed once per process: needs a unified hierarchy with the cpu, memory and pids
    controllers, and either root or a delegated PLAYRUN_SANDBOX_CGROUP."""
    key = (str(settings.sandbox_cgroup), os.geteuid())
    if key in _cgroups:
        return _cgroups[key]
    result: tuple[Path | None, str]
    if not (CGROUP_ROOT / "cgroup.controllers").is_file():
        result = (None, f"not applied: no unified cgroup v2 hierarchy at {CGROUP_ROOT}")
    elif settings.sandbox_cgroup is None and os.geteuid() != 0:
        result = (None, "not applied: not root and PLAYRUN_SANDBOX_CGROUP is unset")
    else:
        base = Path(settings.sandbox_cgroup or CGROUP_ROOT / "playrun")
        try:
            if settings.sandbox_cgroup is None:
                _enable_controllers(CGROUP_ROOT)
            base.mkdir(exist_ok=True)
            _enable_controllers(base)
            trial = base / f"probe-{os.getpid()}"
            trial.mkdir(exist_ok=True)
            trial.rmdir()
            result = (base, f"memory.max, pids.max, cpu.max per sandbox under {base}")
        except OSError as exc:
            result = (None, f"not applied: cgroup v2 at {base} is not usable: {exc}")
    _cgroups[key] = result
    return result


# --- the provider -------------------------------------------------------------------------


class LocalProvider:
    """Sandboxes as directories under `root`, each run by a supervisor process tree."""

    name = "local"
    id_prefix = "lsb"

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
        """The control record: outside the sandbox, or (legacy) its `.playrun` directory."""
        if not self._id_re.match(sandbox_id):
            return None
        outside = self.control_root / sandbox_id
        if (outside / META_FILE).is_file():
            return outside
        legacy = self.root / sandbox_id / sup.CONTROL_DIR
        if (legacy / META_FILE).is_file():
            return legacy
        return None

    def _existing(self, sandbox_id: str) -> tuple[Path, Path]:
        """(control record, sandbox directory); the directory may be gone."""
        control = self._control(sandbox_id)
        path = self._path(sandbox_id)
        if control is None or path is None:
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r}")
        return control, path

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
                parts = _safe_parts(rel)
                if parts[0] == sup.CONTROL_DIR:
                    raise ProviderError(f"{rel!r} is reserved for the provider")
                target = tmp.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                target.write_bytes(content)
            if chown:  # the play's host uid owns its directory and nothing else
                for dirpath, dirnames, filenames in os.walk(tmp):
                    os.chown(dirpath, *owner)
                    for name in dirnames + filenames:
                        os.chown(os.path.join(dirpath, name), *owner, follow_symlinks=False)
            ctl_tmp.mkdir(mode=0o700)
            (ctl_tmp / SUPERVISOR_FILE).write_bytes(_SUPERVISOR_SOURCE)
            (ctl_tmp / SUPERVISOR_FILE).chmod(0o600)
            sup.write_atomic(ctl_tmp / META_FILE, json.dumps(meta).encode())
            ctl_tmp.rename(control)
            tmp.rename(self.root / sandbox_id)
        except OSError as exc:
            for leftover in (tmp, ctl_tmp, control):
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

    def exec_detached(
        self,
        sandbox_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        timeout_s: float,
    ) -> None:
        control, path = self._existing(sandbox_id)
        if not path.is_dir():
            raise SandboxNotFoundError(f"sandbox {sandbox_id} has no directory")
        if (control / PROC_FILE).exists():
            raise ProviderError(f"sandbox {sandbox_id} already has a process")
        if not argv or timeout_s <= 0:
            raise ProviderError("exec_detached needs an argv and a positive timeout")
        meta = self._read_json(control / META_FILE) or {}
        strict = meta.get("isolation") == "strict"
        python = host_layout().python if strict else sys.executable
        expanded: list[str] = []
        for i, arg in enumerate(argv):
            if arg == PYTHON_PLACEHOLDER:
                expanded.append(python)
                if i == 0:
                    expanded.extend(PYTHON_FLAGS)
            else:
                expanded.append(str(arg))
        settings = self.settings
        # Nothing of the worker's environment leaks in: only the base and the caller's env.
        child_env = dict(BASE_ENV)
        child_env.update({str(k): str(v) for k, v in env.items()})
        # Not overridable: delete finds orphaned process-mode processes by this exact entry.
        child_env["HOME"] = sup.SANDBOX_DEST if strict else str(path)
        max_file_mb = int(meta.get("max_file_mb", 64))
        config: dict[str, Any] = {
            "argv": expanded,
            "env": child_env,
            "timeout_s": float(timeout_s),
            "memory_mb": meta.get("memory_mb", 1024),
            "max_file_mb": max_file_mb,
            "cpu_seconds": meta.get("cpu_seconds"),
            "max_dir_mb": meta.get("max_dir_mb"),
            "strict": None,
        }
        prefix: list[str] = []
        if strict:
            gateway_dir, socket_name = _gateway_dir(child_env, settings)
            if GATEWAY_SOCKET_ENV in child_env:
                child_env[GATEWAY_SOCKET_ENV] = f"{sup.GATEWAY_DEST}/{socket_name}"
            config["strict"] = strict_config(
                settings, sandbox_id, path, gateway_dir,
                int(meta.get("max_processes") or settings.sandbox_max_processes), max_file_mb,
                int(meta.get("memory_mb", 1024)),
            )
        else:
            use_ns = self._pid_namespace is not False
            prefix = pid_namespace_command() if use_ns else []
            if self._pid_namespace and not prefix:
                raise ProviderError("a PID namespace was required but is not available here")
        supervisor_path = control / SUPERVISOR_FILE
        cmd = [sys.executable, "-I", str(supervisor_path), str(control), str(path)]
        # The supervisor's own environment has no token: the config arrives on its stdin.
        sup_env = dict(BASE_ENV, HOME=str(path))
        try:
            console = os.open(
                control / sup.CONSOLE_FILE,
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                0o600,
            )
            try:
                _reap_children()
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
            with _children_lock:
                _children[proc.pid] = proc
            stat_ = sup.read_stat(proc.pid)
            record = {
                "pid": proc.pid,
                "starttime": stat_[3] if stat_ else None,
                "pid_namespace": bool(prefix) or strict,
                "isolation": "strict" if strict else "process",
                "started_at": time.time(),
            }
            sup.write_atomic(control / PROC_FILE, json.dumps(record).encode())
            assert proc.stdin is not None
            try:
                proc.stdin.write(json.dumps(config).encode())
            finally:
                proc.stdin.close()
        except OSError as exc:
            raise ProviderError(f"cannot start sandbox {sandbox_id}: {exc}") from exc

    def _top_alive(self, control: Path) -> bool:
        """The recorded top process is alive and really is this sandbox's (not a reused pid)."""
        record = self._read_json(control / PROC_FILE)
        if record is None or not isinstance(record.get("pid"), int):
            return False
        pid = record["pid"]
        stat_ = sup.read_stat(pid)
        if stat_ is None or stat_[0] in ("Z", "X") or stat_[3] != record.get("starttime"):
            return False
        return str(control / SUPERVISOR_FILE) in sup.read_cmdline(pid)

    def _exit_status(self, control: Path) -> ProcessStatus | None:
        record = self._read_json(control / sup.EXIT_FILE)
        if record is None:
            return None
        code = record.get("exit_code")
        limit = record.get("limit")
        return ProcessStatus(
            "exited", code if isinstance(code, int) else None, bool(record.get("timed_out")),
            limit=str(limit) if limit else None,
        )

    def poll(self, sandbox_id: str) -> ProcessStatus:
        control, _ = self._existing(sandbox_id)
        _reap_children()
        status = self._exit_status(control)
        if status is not None:
            return status
        if self._top_alive(control):
            return ProcessStatus("running")
        # The supervisor may have written its record between the two checks.
        status = self._exit_status(control)
        if status is not None:
            return status
        # exec writes the process record before the supervisor gets its argv (on stdin),
        # so without one nothing of the play can have run.
        exists = (control / PROC_FILE).exists()
        return ProcessStatus("missing" if exists else "never_started")

    def read_file(
        self, sandbox_id: str, path: str, *, offset: int = 0, max_bytes: int
    ) -> FileRead | None:
        control, base = self._existing(sandbox_id)
        parts = _safe_parts(path)
        if offset < 0 or max_bytes < 0:
            raise ProviderError("offset and max_bytes must not be negative")
        if parts[0] == sup.CONTROL_DIR:
            # The provider's own files (the console log) live in the control record.
            if len(parts) != 2 or parts[1] not in VISIBLE_CONTROL_FILES:
                return None
            base, parts = control, parts[1:]
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

    def _sandbox_processes(self, sandbox_id: str) -> set[int]:
        """Roots of the sandbox's processes, found from what the play cannot change:
        the recorded supervisor and PID-namespace init (checked by start time), every
        process in that PID namespace, whatever runs its supervisor or bwrap (by command
        line), plus, in process mode, anything started with the sandbox's HOME (a play's
        processes reparented away after its supervisor was killed)."""
        path = self.root / sandbox_id
        control = self._control(sandbox_id) or self.control_root / sandbox_id
        found: set[int] = set()
        for name, pid_key, start_key in ((PROC_FILE, "pid", "starttime"),
                                         (sup.NS_FILE, "init_pid", "init_starttime")):
            record = self._read_json(control / name) or {}
            pid = record.get(pid_key)
            if isinstance(pid, int):
                stat_ = sup.read_stat(pid)
                if stat_ is not None and stat_[3] == record.get(start_key):
                    found.add(pid)
        pidns = (self._read_json(control / sup.NS_FILE) or {}).get("pidns")
        if pidns in (sup.pidns_of(os.getpid()), sup.pidns_of(1)):
            pidns = None  # never our own namespace, whatever the record says
        strict = (self._read_json(control / META_FILE) or {}).get("isolation") == "strict"
        found |= sup.find_processes(
            str(control / SUPERVISOR_FILE),
            sup.BWRAP_MARK + sandbox_id,
            None if strict else b"HOME=" + os.fsencode(path),
            pidns if isinstance(pidns, int) else None,
        )
        return found

    def kill(self, sandbox_id: str) -> None:
        """SIGKILL the sandbox's whole process tree and wait for it to die; keeps the files.
        Works whether or not the sandbox's directory still exists."""
        if self._path(sandbox_id) is None:
            return
        control = self._control(sandbox_id) or self.control_root / sandbox_id
        ns = self._read_json(control / sup.NS_FILE) or {}
        cgroup = Path(ns["cgroup"]) if isinstance(ns.get("cgroup"), str) else None
        if cgroup is not None:
            sup.cgroup_kill(cgroup)
        init = ns.get("init_pid")
        if isinstance(init, int):
            stat_ = sup.read_stat(init)
            if stat_ is not None and stat_[3] == ns.get("init_starttime"):
                # The namespace's init: the kernel kills everything in it with it.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(init, signal.SIGKILL)
        killed = sup.kill_tree(self._sandbox_processes(sandbox_id))
        deadline = time.monotonic() + DELETE_WAIT_S
        while True:
            _reap_children()
            survivors = {pid for pid in killed if sup.is_live(pid)}
            if not survivors:
                if cgroup is not None:
                    sup.cgroup_kill(cgroup)  # now empty: removed
                return
            if time.monotonic() >= deadline:
                raise ProviderError(f"sandbox {sandbox_id}: pids {sorted(survivors)} survived")
            time.sleep(POLL_INTERVAL_S)

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
            _remove_tree(doomed)

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
                    try:
                        if now - entry.stat(follow_symlinks=False).st_mtime > STALE_TMP_S:
                            _remove_tree(Path(entry.path))
                    except OSError:
                        pass
                    continue
                if not self._id_re.match(entry.name) or entry.name in refs:
                    continue
                control = self._control(entry.name)
                meta = self._read_json(control / META_FILE) if control else None
                if meta is None:
                    continue
                ref = self._ref(entry.name, meta)
                if all(ref.labels.get(k) == v for k, v in wanted.items()):
                    refs[entry.name] = ref
        return sorted(refs.values(), key=lambda r: (r.created_at, r.sandbox_id))

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
