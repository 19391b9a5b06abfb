"""Unit-tier doubles: start permits from an in-memory limiter (the fleet-wide bucket lives
in Redis; the `fake_stack` fixture in tests/conftest.py puts it in place), and the runtime
API served from a thread of the test process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from tasks.acquisition.startrate import Penalty, Permit


@dataclass
class FakeLimiter:
    """Grants every permit (or refuses with `wait_ms`); records what it was asked."""

    wait_ms: int = 0
    asked: list[str] = field(default_factory=list)
    penalties: list[int] = field(default_factory=list)

    def acquire(self, bucket: str, rules: Any, observed_successes: int = 0) -> Permit:
        self.asked.append(bucket)
        granted = self.wait_ms == 0
        return Permit(granted=granted, wait_ms=self.wait_ms, scheduled_at_ms=0,
                      server_now_ms=0, rate=60.0, epoch=1, degraded=False)

    def penalize_detail(self, bucket: str, rules: Any, epoch: int, cooldown_ms: int) -> Penalty:
        self.penalties.append(epoch)
        return Penalty(applied=True, rate=30.0, epoch=epoch + 1, cooldown_until_ms=0,
                       server_now_ms=0)

    def inspect(self, bucket: str, rules: Any) -> list[Any]:
        raise RedisError("the in-memory limiter keeps no bucket state to show")


@dataclass
class ServedGateway:
    """The runtime API served over real HTTP from a thread of this process."""

    url: str
    sent: list[tuple[str, list[Any], str]]  # release tasks it would have sent


@contextmanager
def served_gateway() -> Iterator[ServedGateway]:
    """The gateway app under uvicorn on a free loopback port, on this test's database (the
    settings in force when the request arrives); stopped on exit."""
    import uvicorn

    from tasks.gateway.app import create_app
    from tasks.host.processes import free_port
    from tasks.settings import get_settings

    sent: list[tuple[str, list[Any], str]] = []
    asgi = create_app(get_settings(), lambda name, args, queue: sent.append((name, args, queue)))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=port, lifespan="off",
                                           log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, name="unit-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the in-process gateway did not start")
        time.sleep(0.01)
    try:
        yield ServedGateway(f"http://127.0.0.1:{port}", sent)
    finally:
        server.should_exit = True
        thread.join(10)
        asgi.state.releases.close()
