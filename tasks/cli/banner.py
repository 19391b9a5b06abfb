"""What the demo's and `playrun dev`'s banners say: every URL the stack serves, and the
isolation mode its worker runs plays in."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import sys
import time
from pathlib import Path

from tasks.host.processes import free_port
from tasks.testing import Stack
from tasks.testing.child import Child

METRICS_KINDS = ("worker", "beat", "gateway")
# Each process writes its metrics URL once it listens; the banner waits this long for them.
METRICS_WAIT_S = 10.0


def metrics_urls(stack: Stack) -> list[tuple[str, str]]:
    """(kind, URL) of each process's Prometheus endpoint, read from the URL files the
    processes write (their ports are picked free, so they never clash with another stack)."""
    folder = Path(stack.env["PLAYRUN_METRICS_DIR"])
    found: dict[str, str] = {}
    deadline = time.monotonic() + METRICS_WAIT_S
    while len(found) < len(METRICS_KINDS) and time.monotonic() < deadline:
        for kind in METRICS_KINDS:
            for path in sorted(folder.glob(f"{kind}-*.url")):
                with contextlib.suppress(OSError):
                    found[kind] = path.read_text().strip()
        if len(found) < len(METRICS_KINDS):
            time.sleep(0.1)
    return [(kind, found[kind]) for kind in METRICS_KINDS if kind in found]


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


def rows(stack: Stack) -> list[tuple[str, str]]:
    """Rows every stack prints once up; a blank label continues the row above."""
    env = stack.env
    out = [("database", env["PLAYRUN_DATABASE_URL"]), ("redis", env["PLAYRUN_REDIS_URL"]),
           ("gateway", env["PLAYRUN_GATEWAY_URL"])]
    out += [("metrics" if i == 0 else "", f"{url}  ({kind})")
            for i, (kind, url) in enumerate(metrics_urls(stack))]
    out += [("isolation" if i == 0 else "", line) for i, line in enumerate(isolation_mode())]
    return [*out, ("logs", f"{stack.home}/*.log")]


def wait_listening(port: int, child: Child, timeout: float) -> bool:
    """True once 127.0.0.1:PORT accepts; False if the child ends or TIMEOUT passes first."""
    deadline = time.monotonic() + timeout
    while child.running and time.monotonic() < deadline:
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.settimeout(0.5)
            sock.connect(("127.0.0.1", port))
            return True
        time.sleep(0.1)
    return False


def start_flower(stack: Stack) -> str | None:
    """Flower on a free port when the `flower` extra is installed; its URL, or None."""
    if importlib.util.find_spec("flower") is None:
        return None
    port = free_port()
    child = stack.add(Child("flower", [sys.executable, "-m", "celery", "-A", "tasks", "flower",
                                       "--address=127.0.0.1", f"--port={port}"],
                            stack.child_env(), stack.home / "flower.log").start())
    return f"http://127.0.0.1:{port}" if wait_listening(port, child, 30.0) else None
