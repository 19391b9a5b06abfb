"""The processes of a playrun stack as Children: a Celery worker, beat, the gateway, and
any `playrun` CLI command (the dashboard)."""

from __future__ import annotations

import secrets
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from tasks.testing.child import Child

PYTHON = sys.executable


def worker_argv(
    name: str,
    *,
    concurrency: int = 2,
    beat: bool = False,
    loglevel: str = "INFO",
    extra: tuple[str, ...] = (),
) -> list[str]:
    # Without mingle and gossip: a worker is ready in about a second, not after a
    # round of broadcasts its peers may never answer.
    argv = [
        PYTHON,
        "-m",
        "celery",
        "-A",
        "tasks",
        "worker",
        "-n",
        name,
        f"--concurrency={concurrency}",
        f"--loglevel={loglevel}",
        "--without-mingle",
        "--without-gossip",
        *extra,
    ]
    return [*argv, "--beat"] if beat else argv


class Worker(Child):
    """`celery -A tasks worker` (with `--beat` when `beat`)."""

    ready_text = "ready."
    ready_timeout = 90.0

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        *,
        name: str | None = None,
        concurrency: int = 2,
        beat: bool = False,
        loglevel: str = "INFO",
        extra: tuple[str, ...] = (),
    ) -> None:
        name = name or f"w{secrets.token_hex(4)}@playrun"
        super().__init__(
            name,
            worker_argv(name, concurrency=concurrency, beat=beat, loglevel=loglevel, extra=extra),
            env,
            log_path,
        )


class Beat(Child):
    """A standalone `celery -A tasks beat`: the reaper, sweeps and GC on their schedule."""

    ready_text = "beat: Starting"
    ready_timeout = 90.0

    def __init__(self, env: Mapping[str, str], log_path: Path, *, name: str = "beat") -> None:
        super().__init__(
            name, [PYTHON, "-m", "celery", "-A", "tasks", "beat", "--loglevel=INFO"], env, log_path
        )


class Cli(Child):
    """`python -m tasks.cli.main ARGS` (the `playrun` command)."""

    def __init__(
        self,
        name: str,
        args: tuple[str, ...],
        env: Mapping[str, str],
        log_path: Path,
        *,
        ready_text: str | None = None,
    ) -> None:
        super().__init__(
            name, [PYTHON, "-m", "tasks.cli.main", *args], env, log_path, ready_text=ready_text
        )


def gateway_args(workers: int | None) -> tuple[str, ...]:
    return ("gateway",) if workers is None else ("gateway", "--workers", str(workers))


class Gateway(Cli):
    """`playrun gateway [--workers N]`, ready once it says so and its /healthz answers 200
    on PLAYRUN_GATEWAY_URL (its Unix socket is PLAYRUN_GATEWAY_SOCKET)."""

    ready_text = "gateway ready"

    def __init__(self, env: Mapping[str, str], log_path: Path, *, name: str = "gateway",
                 workers: int | None = None) -> None:
        super().__init__(name, gateway_args(workers), env, log_path)
        self.url = self.env["PLAYRUN_GATEWAY_URL"]

    def is_ready(self) -> bool:
        if not super().is_ready():
            return False
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=1) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):
            return False
