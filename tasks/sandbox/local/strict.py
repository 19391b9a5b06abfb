"""Strict isolation's host side: what a bubblewrap sandbox sees of the host (resolved once
per process) and the `strict` part of the supervisor's config. The bwrap command line
itself is built by the supervisor (tasks/sandbox/supervisor_strict.py) from this config."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.sandbox.base import ProviderError
from tasks.sandbox.local.limits import cgroup_base, cgroup_limits
from tasks.sandbox.supervisor_strict import GATEWAY_DEST, SANDBOX_DEST
from tasks.settings import Settings

GATEWAY_SOCKET_ENV = "PLAYRUN_GATEWAY_SOCKET"
# Run inside the sandbox before the command: the process limit is set from within the
# sandbox's user namespace, so it counts only this sandbox's processes.
NPROC_PRELUDE = (
    "import os,resource,sys;n=int(sys.argv[1]);"
    "resource.setrlimit(resource.RLIMIT_NPROC,(n,n));os.execvp(sys.argv[2],sys.argv[2:])"
)


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


def gateway_socket_dir(env: Mapping[str, str], settings: Settings) -> tuple[Path, str]:
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
    binds: list[dict[str, Any]] = [{"src": str(sandbox_dir), "dest": SANDBOX_DEST, "rw": True}]
    binds += [{"src": d, "dest": d, "rw": False} for d in layout.python_dirs]
    if gateway_dir is not None:
        if not gateway_dir.is_dir():
            with contextlib.suppress(OSError):
                gateway_dir.mkdir(parents=True, mode=0o755)
        if gateway_dir.is_dir():
            # The directory, not the socket: a restarted gateway's new socket shows up too.
            binds.append({"src": str(gateway_dir), "dest": GATEWAY_DEST, "rw": False})
    if layout.prlimit:
        prefix = [layout.prlimit, f"--nproc={max_processes}", "--"]
    else:
        prefix = [layout.python, "-I", "-S", "-c", NPROC_PRELUDE, str(max_processes)]
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
            "limits": cgroup_limits(memory_mb, max_processes, settings.sandbox_cpus, base),
        }
    return config
