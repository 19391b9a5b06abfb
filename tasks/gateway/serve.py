"""`playrun gateway`: the runtime API under uvicorn, on TCP and on a Unix socket.

Strict sandboxes have no network; they reach the gateway only through the socket,
whose directory is bound into each of them (so a restarted gateway's new socket is
seen by running sandboxes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import REGISTRY

from tasks.broker.publish import publisher
from tasks.gateway.app import create_app
from tasks.observe import serve as metrics_serve
from tasks.settings import Settings
from tasks.store.db import require_current_schema

log = logging.getLogger("playrun.gateway")


class _Server(uvicorn.Server):
    """Two servers share one loop: signals are handled once, for both (see _serve)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def prepare_socket(path: Path) -> None:
    """The socket's directory holds only the socket; sandboxes (other uids) may connect."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _send(name: str, args: list[Any], queue_name: str) -> None:
    """One task message by the lean publish (kombu's envelope in one LPUSH): Celery's
    send_task was a tenth of the gateway's CPU."""
    publisher().send_many([(str(uuid.uuid4()), name, args)], queue_name)


async def _serve(settings: Settings) -> None:
    asgi = create_app(settings, _send)
    host, port = settings.gateway_listen_address()
    socket_path = Path(settings.gateway_socket)
    prepare_socket(socket_path)
    common: dict[str, Any] = {"log_level": "warning", "access_log": False,
                              "lifespan": "off", "timeout_graceful_shutdown": 5,
                              # Runners keep their connection between beats (every 5 s).
                              "timeout_keep_alive": 20}
    tcp = _Server(uvicorn.Config(asgi, host=host, port=port, **common))
    uds = _Server(uvicorn.Config(asgi, uds=str(socket_path), **common))
    loop = asyncio.get_running_loop()

    def stop() -> None:
        tcp.should_exit = uds.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    log.info("gateway listening on http://%s:%s and %s", host, port, socket_path)

    async def chmod_when_bound() -> None:
        while not (tcp.started and uds.started):  # "ready" only once both listen
            if tcp.should_exit or uds.should_exit:
                return
            await asyncio.sleep(0.01)
        os.chmod(socket_path, 0o666)
        print(f"playrun gateway ready on http://{host}:{port} and unix:{socket_path}",
              flush=True)

    try:
        await asyncio.gather(tcp.serve(), uds.serve(), chmod_when_bound())
    finally:
        await asyncio.to_thread(asgi.state.releases.close)  # what settled goes out


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop where it is installed (a dependency on Linux): the gateway's event
    loop and HTTP parsing (httptools, which uvicorn picks itself) were half its CPU."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def serve(settings: Settings) -> None:
    settings.check_for_server()
    require_current_schema()
    if settings.metrics_enabled:
        # Its own listener: sandboxes reach the runtime port and socket, never this one.
        metrics_serve.serve("gateway", settings, REGISTRY)
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_serve(settings))
    finally:
        metrics_serve.stop("gateway", settings)
