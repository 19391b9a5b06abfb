"""cgroup limits for local sandboxes: which directory sandboxes' cgroups go under, and what
each one gets. cgroup v2 (a unified hierarchy) limits memory, processes and CPU; where only
a cgroup v1 `cpu` hierarchy is writable (as root), each sandbox gets its CPU share and
quota there, and rlimits hold memory and processes. The rlimits are set by the
supervisor itself (tasks/sandbox/supervisor_limits.py), which also enters and kills the cgroups."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from tasks.settings import Settings

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_CONTROLLERS = ("cpu", "memory", "pids")
CGROUP_CPU_PERIOD_US = 100_000
# cgroup v1: all sandboxes under one group weigh as one task of the host, so the gateway and
# workers come first, and each sandbox weighs the same however many threads it runs.
CGROUP_V1_CPU = "cpu"
CGROUP_V1_SHARES = 1024
_cgroups: dict[tuple[str, int], tuple[Path | None, str]] = {}


def is_v1(base: Path) -> bool:
    return not (base / "cgroup.controllers").is_file()


def cgroup_limits(memory_mb: int, max_processes: int, cpus: float,
                  base: Path | None = None) -> dict[str, str]:
    """The interface files a sandbox's cgroup gets: total memory (no swap), processes, CPU;
    under a cgroup v1 `cpu` base, its CPU share and quota alone."""
    if base is not None and is_v1(base):
        return {
            "cpu.shares": str(CGROUP_V1_SHARES),
            "cpu.cfs_period_us": str(CGROUP_CPU_PERIOD_US),
            "cpu.cfs_quota_us": str(int(cpus * CGROUP_CPU_PERIOD_US)),
        }
    return {
        "memory.max": str(int(memory_mb) * 1024 * 1024),
        "memory.swap.max": "0",
        "pids.max": str(int(max_processes)),
        "cpu.max": f"{int(cpus * CGROUP_CPU_PERIOD_US)} {CGROUP_CPU_PERIOD_US}",
    }


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
        result = _v1_cpu_base(settings)
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
    if result[0] is not None:
        _sweep_empty(result[0])
    return result


def _sweep_empty(base: Path) -> None:
    """Remove sandboxes' cgroups left empty (a sandbox killed with its supervisor): the
    kernel refuses to remove one that still holds a process."""
    for child in base.glob("lsb-*"):
        with contextlib.suppress(OSError):
            child.rmdir()


def _v1_cpu_base(settings: Settings) -> tuple[Path | None, str]:
    """A cgroup v1 `cpu` hierarchy, as root (or a delegated directory in it)."""
    hierarchy = CGROUP_ROOT / CGROUP_V1_CPU
    unified = f"no unified cgroup v2 hierarchy at {CGROUP_ROOT}"
    if settings.sandbox_cgroup is None and (
            os.geteuid() != 0 or not (hierarchy / "cpu.shares").is_file()):
        return None, f"not applied: {unified}"
    base = Path(settings.sandbox_cgroup or hierarchy / "playrun")
    try:
        base.mkdir(exist_ok=True)
        trial = base / f"probe-{os.getpid()}"
        trial.mkdir(exist_ok=True)
        missing = [n for n in ("cpu.shares", "cpu.cfs_quota_us", "cgroup.procs")
                   if not (trial / n).is_file()]
        trial.rmdir()
        if missing:
            raise OSError(f"{missing} missing: not a cgroup v1 cpu hierarchy")
    except OSError as exc:
        return None, f"not applied: {unified}, and cgroup v1 cpu at {base} is not usable: {exc}"
    return base, (f"cpu.shares and cpu.cfs_quota_us per sandbox under {base} (cgroup v1: "
                  "memory and processes by rlimits)")
