"""Real `celery -A tasks worker` and `playrun gateway` subprocesses on the session's
PostgreSQL and Redis."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tasks.host.processes import die_with_parent, stop_group
from tests.support.paths import ROOT
from tests.support.session import BASE_ENV


def worker_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYRUN_")}
    env.update(BASE_ENV)
    env.update(overrides)
    return env


class Worker:
    """A real `celery -A tasks worker` subprocess."""

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
        self.name = name or f"w{secrets.token_hex(4)}@test"
        self.log_path = log_path or Path(tempfile.mktemp(prefix="playrun-worker-", suffix=".log"))
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks",
            "worker",
            "-n",
            self.name,
            f"--concurrency={concurrency}",
            "--loglevel=INFO",
            "--without-mingle",
            "--without-gossip",
        ]
        if beat:
            args.append("--beat")
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args,
            env=env,
            cwd=str(ROOT),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.output()[-3000:]}")
            if b"ready." in self.log_path.read_bytes():
                return
            time.sleep(0.1)
        raise RuntimeError(f"worker not ready: {self.output()[-3000:]}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def child_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def stop(self, sig: int = 15) -> None:
        stop_group(self.proc, sig)
        self.log.close()


class Gateway:
    """A real `playrun gateway` subprocess (TCP and Unix socket)."""

    module = "tasks.cli.main"  # run as `python -m module gateway`

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.url = env["PLAYRUN_GATEWAY_URL"]
        self.log_path = Path(tempfile.mktemp(prefix="playrun-gateway-", suffix=".log"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, "gateway"],
            env=self.env,
            cwd=str(ROOT),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self.wait_ready()

    def wait_ready(self, timeout: float = 30.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited: {self.output()[-3000:]}")
            try:
                if (
                    httpx.get(self.url + "/healthz", timeout=1).status_code == 200
                    and b"ready" in self.log_path.read_bytes()
                ):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"gateway not ready: {self.output()[-3000:]}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = 15) -> None:
        if self.proc is not None:
            stop_group(self.proc, sig)
        self.log.close()
