"""Which isolation mode local sandboxes run in (`PLAYRUN_SANDBOX_ISOLATION`, see
docs/design.md "Strict isolation"): `strict` only where a probe run through the real
supervisor and bubblewrap works, `auto` falling back to `process`; and the workers'
start-up check that says so."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Literal

from tasks.errors import ConfigurationError
from tasks.sandbox import supervisor_proc, supervisor_strict
from tasks.sandbox.base import ProviderError
from tasks.sandbox.local.config import BASE_ENV, exec_config
from tasks.sandbox.local.limits import cgroup_base
from tasks.sandbox.local.records import (
    CONTROL_ROOT,
    SUPERVISOR_FILE,
    SUPERVISOR_FILES,
    read_json,
    remove_tree,
)
from tasks.sandbox.local.strict import gateway_socket_dir, host_layout, strict_config
from tasks.settings import Settings, get_settings

log = logging.getLogger("playrun.sandbox")
Isolation = Literal["strict", "process"]
PROBE_TIMEOUT_S = 30.0

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
        gateway_dir, _ = gateway_socket_dir({}, settings)
        try:
            strict = strict_config(settings, "lsb-probe", sandbox, gateway_dir, 16, 1)
        except ProviderError as exc:
            return exc.message
        config = exec_config(
            [host_layout().python, "-I", "-S", "-c", "open('ok', 'w').write('ok')"],
            dict(BASE_ENV), PROBE_TIMEOUT_S,
            memory_mb=1024, max_file_mb=1, cpu_seconds=None, max_dir_mb=None, strict=strict,
        )
        for name, source in SUPERVISOR_FILES.items():  # as a sandbox's control record has them
            (control / name).write_bytes(source)
        console = control / supervisor_proc.CONSOLE_FILE
        with open(console, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-I", str(control / SUPERVISOR_FILE), str(control),
                 str(sandbox)],
                stdin=subprocess.PIPE, stdout=out, stderr=out, env=dict(BASE_ENV),
                cwd=str(control), close_fds=True,
            )
            try:
                proc.communicate(json.dumps(config).encode(), timeout=PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return "the bubblewrap probe did not finish"
        exit_record = read_json(control / supervisor_proc.EXIT_FILE) or {}
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
        remove_tree(work)


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
            "dir cap %d MB; cgroup limits: %s)",
            "on" if supervisor_strict.seccomp_program() else "off (not x86_64)",
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
