"""cgroup v2 limits for local sandboxes (where a unified hierarchy is available): which
directory sandboxes' cgroups go under, and what each one gets. The rlimits are set by the
supervisor itself (tasks/sandbox/supervisor_limits.py), which also enters and kills the cgroups."""

from __future__ import annotations

import os
from pathlib import Path

from tasks.settings import Settings

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_CONTROLLERS = ("cpu", "memory", "pids")
CGROUP_CPU_PERIOD_US = 100_000
_cgroups: dict[tuple[str, int], tuple[Path | None, str]] = {}


def cgroup_limits(memory_mb: int, max_processes: int, cpus: float) -> dict[str, str]:
    """The interface files a sandbox's cgroup gets: total memory (no swap), processes, CPU."""
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
