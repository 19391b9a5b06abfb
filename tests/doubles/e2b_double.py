"""A loopback E2B for the real `e2b` SDK: control plane REST and envd connect-rpc on
one uvicorn listener (E2B_API_URL and E2B_SANDBOX_URL both point at it, over HTTP/1.1).

The SDK's HTTP stack is pyqwest (Rust), so nothing can be patched in between: this is
a real server, and each sandbox is a directory whose commands run as local processes.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from tasks.sandbox import SandboxProvider
from tests.doubles.base import PushBack
from tests.doubles.e2b_api import ControlPlane
from tests.doubles.e2b_envd import Envd
from tests.doubles.e2b_state import Pushback, World, kill_all

# The adapter's create timeout here; a lost answer comes this much later than that.
CLIENT_TIMEOUT_S = 3.0
LOST_ANSWER_AFTER_S = CLIENT_TIMEOUT_S + 2.0


class E2BDouble:
    name = "e2b"
    pushback = True

    def __init__(self, world: World, url: str) -> None:
        self.world = world
        self.url = url
        self.env = {
            "E2B_API_KEY": world.api_key,
            "E2B_API_URL": url,
            "E2B_SANDBOX_URL": url,
            "E2B_DOMAIN": "e2b.loopback",
            "E2B_HTTP_VERSION": "1.1",
        }

    def provider(self, root: Path) -> SandboxProvider:
        from tasks.sandbox.providers.e2b import E2BProvider

        return E2BProvider(
            root,
            api_params={
                "api_key": self.world.api_key,
                "api_url": self.url,
                "sandbox_url": self.url,
                "domain": "e2b.loopback",
                "http_version": "1.1",
            },
            request_timeout_s=CLIENT_TIMEOUT_S,
        )

    def push_back(
        self, kind: PushBack, *, retry_after_s: float | None = None, times: int = 1
    ) -> None:
        with self.world.lock:
            self.world.pushbacks.extend(Pushback(kind, retry_after_s) for _ in range(times))

    def create_after_timeout(self) -> None:
        with self.world.lock:
            self.world.lost_answers += 1
            self.world.lost_answer_delay_s = LOST_ANSWER_AFTER_S

    def kill_runner(self, sandbox_id: str) -> None:
        kill_all(sandbox_id)

    def live_count(self) -> int:
        self.world.expire()
        with self.world.lock:
            return len(self.world.boxes)

    def max_live_seen(self) -> int:
        with self.world.lock:
            return self.world.peak_live

    def creates(self) -> int:
        with self.world.lock:
            return self.world.n_creates

    def rejected_429(self) -> int:
        with self.world.lock:
            return self.world.n_rejected_429

    def sandboxes(self) -> list[str]:
        self.world.expire()
        with self.world.lock:
            return sorted(self.world.boxes)


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # runs in a thread: signals stay the test's
        pass


@contextmanager
def running(
    tmp_path: Path,
    *,
    creates_per_min: float | None = None,
    max_live: int | None = None,
    create_latency_s: float = 0.0,
    **_knobs: Any,
) -> Iterator[E2BDouble]:
    world = World(
        tmp_path / "e2b-sandboxes",
        api_key="e2b_" + secrets.token_hex(20),
        creates_per_min=creates_per_min,
        max_live=max_live,
        create_latency_s=create_latency_s,
    )
    world.root.mkdir(parents=True, exist_ok=True)
    app = ControlPlane(world, Envd(world))
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        log_level="warning",
        loop="asyncio",
        http="h11",
        timeout_graceful_shutdown=1,
        access_log=False,
    )
    server = _Server(config)
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="e2b-double", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the E2B double did not start")
        time.sleep(0.01)
    try:
        yield E2BDouble(world, f"http://127.0.0.1:{sock.getsockname()[1]}")
    finally:
        world.closing = True
        for sandbox_id in list(world.boxes):
            world.remove(sandbox_id)
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
