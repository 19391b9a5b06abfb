"""Real `celery -A tasks worker` and `playrun gateway` subprocesses on the session's
PostgreSQL and Redis: tasks.testing's roles with this suite's defaults (beat on, logs in
temporary files, started at construction)."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path
from typing import Self

from tasks.testing import roles
from tests.support.paths import ROOT
from tests.support.session import BASE_ENV


def worker_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYRUN_")}
    env.update(BASE_ENV)
    env.update(overrides)
    return env


def _log(role: str) -> Path:
    return Path(tempfile.mktemp(prefix=f"playrun-{role}-", suffix=".log"))


class Worker(roles.Worker):
    """A real `celery -A tasks worker` subprocess, started (not yet ready) when built."""

    ready_timeout = 30.0

    # With beat by default: quiet runners are found only by the reaper.
    def __init__(
        self,
        env: dict[str, str],
        *,
        concurrency: int = 2,
        beat: bool = True,
        log_path: Path | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(env, log_path or _log("worker"),
                         name=name or f"w{secrets.token_hex(4)}@test",
                         concurrency=concurrency, beat=beat)
        self.cwd = ROOT
        self.start()


class Gateway(roles.Gateway):
    """A real `playrun gateway` subprocess (TCP and Unix socket), ready when built and after
    every start()."""

    ready_timeout = 30.0
    module = "tasks.cli.main"  # run as `python -m module gateway`

    def __init__(self, env: dict[str, str], *, workers: int | None = None) -> None:
        super().__init__(env, _log("gateway"), workers=workers)
        self.argv = [roles.PYTHON, "-m", self.module, *roles.gateway_args(workers)]
        self.cwd = ROOT
        self.start()

    def start(self) -> Self:
        super().start()
        return self.wait_ready()
