"""`playrun gateway`: the runtime API under uvicorn, on TCP and on a Unix socket, in one
process or several (tasks/gateway/procs.py) that share both listening sockets.

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
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import REGISTRY

from tasks.broker.publish import publisher
from tasks.gateway.app import create_app
from tasks.gateway.procs import Supervisor
from tasks.observe import serve as metrics_serve
from tasks.settings import Settings
from tasks.store.db import dispose_engines, require_current_schema

log = logging.getLogger("playrun.gateway")

BACKLOG = 2048


class _Server(uvicorn.Server):
    """Signals are ours (see _serve): uvicorn's own would re-raise SIGTERM once it stops,
    before the queued releases are sent."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def process_count(settings: Settings) -> int:
    """How many gateway processes serve: the setting, else the cores (at most 4)."""
    if settings.gateway_workers:
        return settings.gateway_workers
    # The cores this process may run on (a container's cpuset), not the machine's.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return min(cores or os.cpu_count() or 1, 4)


def prepare_socket(path: Path) -> None:
    """The socket's directory holds only the socket; sandboxes (other uids) may connect."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def bind(settings: Settings) -> list[socket.socket]:
    """The TCP sockets of the gateway's address (every one its host name resolves to, as
    uvicorn would bind) and its Unix socket, listening: bound once, served by every
    process."""
    host, port = settings.gateway_listen_address()
    bound: list[socket.socket] = []
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    for family, kind, proto, _name, address in dict.fromkeys(infos):
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # an IPv4 address of the same name binds on its own
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        bound.append(sock)
    socket_path = Path(settings.gateway_socket)
    prepare_socket(socket_path)
    uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    uds.bind(str(socket_path))
    os.chmod(socket_path, 0o666)  # sandboxes run as other uids
    bound.append(uds)
    for sock in bound:
        sock.listen(BACKLOG)
    return bound


def _send(name: str, args: list[Any], queue_name: str) -> None:
    """One task message by the lean publish (kombu's envelope in one LPUSH): Celery's
    send_task was a tenth of the gateway's CPU."""
    publisher().send_many([(str(uuid.uuid4()), name, args)], queue_name)


async def _serve(settings: Settings, sockets: list[socket.socket],
                 ready: Callable[[], None]) -> None:
    asgi = create_app(settings, _send)
    server = _Server(uvicorn.Config(asgi, log_level="warning", access_log=False,
                                    lifespan="off", timeout_graceful_shutdown=5,
                                    backlog=BACKLOG,
                                    # Runners keep their connection between beats (5 s).
                                    timeout_keep_alive=20))
    loop = asyncio.get_running_loop()

    def stop() -> None:
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)

    async def when_serving() -> None:
        while not server.started:  # "ready" only once every socket is served
            if server.should_exit:
                return
            await asyncio.sleep(0.01)
        ready()

    try:
        await asyncio.gather(server.serve(sockets=sockets), when_serving())
    finally:
        # Budget releases still queued go out (a hold left behind expires on its own).
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asgi.state.limits.drain(), 1.0)
        await asyncio.to_thread(asgi.state.releases.close)  # what settled goes out


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop where it is installed (a dependency on Linux): the gateway's event
    loop and HTTP parsing (httptools, which uvicorn picks itself) were half its CPU."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _run(settings: Settings, sockets: list[socket.socket], ready: Callable[[], None]) -> None:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(settings, sockets, ready))


def serve(settings: Settings, workers: int | None = None) -> None:
    """Serve with `workers` processes (default: the setting, else the cores)."""
    settings.check_for_server()
    require_current_schema()
    count = workers or process_count(settings)
    sockets = bind(settings)
    host, port = settings.gateway_listen_address()
    port = port or sockets[0].getsockname()[1]
    where = f"http://{host}:{port} and unix:{settings.gateway_socket}"

    def announce() -> None:
        print(f"playrun gateway ready on {where}", flush=True)

    log.info("gateway listening on %s with %d process(es)", where, count)
    try:
        if count == 1:
            _serve_alone(settings, sockets, announce)
        else:
            _serve_many(settings, sockets, count, announce)
    finally:
        for sock in sockets:
            sock.close()


def _serve_alone(settings: Settings, sockets: list[socket.socket],
                 announce: Callable[[], None]) -> None:
    if settings.metrics_enabled:
        # Its own listener: sandboxes reach the runtime port and socket, never this one.
        metrics_serve.serve("gateway", settings, REGISTRY)
    try:
        _run(settings, sockets, announce)
    finally:
        metrics_serve.stop("gateway", settings)


def _serve_many(settings: Settings, sockets: list[socket.socket], count: int,
                announce: Callable[[], None]) -> None:
    """Children forked from here share the sockets; one metrics listener sums them."""
    dispose_engines()  # the schema check's connections must not be shared with children
    if settings.metrics_enabled:
        metrics_serve.serve("gateway", settings,
                            metrics_serve.start_multiprocess(settings, "gateway"))
    supervisor = Supervisor(count, lambda ready: _run(settings, sockets, ready),
                            on_ready=announce, on_exit=metrics_serve.child_exited)
    try:
        status = supervisor.run()
    finally:
        metrics_serve.stop("gateway", settings)
    if status:
        raise SystemExit(status)
