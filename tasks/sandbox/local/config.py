"""The exec config a local sandbox's supervisor is handed on its stdin (never on disk: the
env holds the run's token): the command, a scrubbed environment, the limits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tasks.sandbox.base import ExitReport

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


def expand_argv(argv: Sequence[str], python: str) -> list[str]:
    """argv with PYTHON_PLACEHOLDER replaced by `python` (plus PYTHON_FLAGS as argv[0])."""
    expanded: list[str] = []
    for i, arg in enumerate(argv):
        if arg == PYTHON_PLACEHOLDER:
            expanded.append(python)
            if i == 0:
                expanded.extend(PYTHON_FLAGS)
        else:
            expanded.append(str(arg))
    return expanded


def sandbox_env(env: Mapping[str, str], home: str) -> dict[str, str]:
    """Nothing of the worker's environment leaks in: only the base and the caller's env."""
    child_env = dict(BASE_ENV)
    child_env.update({str(k): str(v) for k, v in env.items()})
    # Not overridable: delete finds orphaned process-mode processes by this exact entry.
    child_env["HOME"] = home
    return child_env


def exec_config(
    argv: list[str],
    env: dict[str, str],
    timeout_s: float,
    *,
    memory_mb: Any,
    max_file_mb: int,
    cpu_seconds: Any,
    max_dir_mb: Any,
    strict: dict[str, Any] | None,
    report: ExitReport | None = None,
    nice: int = 0,
) -> dict[str, Any]:
    """The document the supervisor reads (see supervise() in tasks/sandbox/supervisor.py);
    `report`, for the supervisor alone, never reaches the command's environment."""
    return {
        "argv": argv,
        "env": env,
        "timeout_s": float(timeout_s),
        "memory_mb": memory_mb,
        "max_file_mb": max_file_mb,
        "cpu_seconds": cpu_seconds,
        "max_dir_mb": max_dir_mb,
        "strict": strict,
        "nice": int(nice),
        "report": None if report is None else {
            "token": report.token, "url": report.url, "socket": report.socket},
    }
