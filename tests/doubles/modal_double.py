"""A loopback Modal: the real `modal` SDK talks gRPC to it, and its sandboxes are local
process trees, so a runner started in one calls the real gateway.

One grpclib server on 127.0.0.1 serves the control plane (ModalClient) and the task
command router; the SDK accepts plain http for both when the server is localhost.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from grpclib.server import Server
from modal._utils.grpc_utils import custom_detail_codec
from modal_proto import api_pb2

from tasks.sandbox.providers.modal import ModalProvider
from tests.doubles.base import PushBack
from tests.doubles.modal_control import ControlServicer
from tests.doubles.modal_router import RouterServicer
from tests.doubles.modal_world import World, kill_tree

T = TypeVar("T")
# The adapter gives up on a create after this long here; a lost answer comes later.
CREATE_TIMEOUT_S = 2.0
LOST_ANSWER_DELAY_S = CREATE_TIMEOUT_S + 3.0


class ModalDouble:
    name = "modal"
    pushback = True

    def __init__(self, world: World, loop: asyncio.AbstractEventLoop, url: str) -> None:
        self.world = world
        self.loop = loop
        self.url = url
        self.env = {
            "MODAL_SERVER_URL": url,
            "MODAL_TOKEN_ID": world.token_id,
            "MODAL_TOKEN_SECRET": world.token_secret,
            # The worker hands every server pushback to its own limiter.
            "MODAL_MAX_THROTTLE_WAIT": "0",
        }

    def _on_loop(self, fn: Callable[[], T]) -> T:
        done: Future[T] = Future()

        def call() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the caller's thread
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(call)
        return done.result(timeout=30)

    def provider(self, root: Path) -> ModalProvider:
        return ModalProvider(
            root, environ=self.env, create_timeout_s=CREATE_TIMEOUT_S, call_timeout_s=30.0
        )

    def push_back(
        self, kind: PushBack, *, retry_after_s: float | None = None, times: int = 1
    ) -> None:
        from tests.doubles.modal_world import Fault

        self._on_loop(
            lambda: self.world.faults.extend(Fault(kind, retry_after_s) for _ in range(times))
        )

    def create_after_timeout(self) -> None:
        def arm() -> None:
            self.world.lose_answers += 1
            self.world.lost_answer_delay_s = LOST_ANSWER_DELAY_S

        self._on_loop(arm)

    def kill_runner(self, sandbox_id: str) -> None:
        """Kills every process in the sandbox: its entrypoint is the runner's keeper, and
        a Modal sandbox ends with its entrypoint."""
        kill_tree(sandbox_id)

    def live_count(self) -> int:
        return self._on_loop(self.world.live)

    def max_live_seen(self) -> int:
        with self.world.lock:
            return self.world.peak_live

    def creates(self) -> int:
        with self.world.lock:
            return self.world.created

    def rejected_429(self) -> int:
        with self.world.lock:
            return self.world.rate_rejections

    def sandboxes(self) -> list[str]:
        return self._on_loop(lambda: [b.id for b in self.world.boxes.values() if b.result is None])

    def network(self, sandbox_id: str) -> api_pb2.NetworkAccess:
        """The egress policy the sandbox was created with."""
        return self._on_loop(lambda: self.world.boxes[sandbox_id].network)


@contextmanager
def running(
    tmp_path: Path,
    *,
    creates_per_min: float | None = None,
    max_live: int | None = None,
    create_latency_s: float = 0.0,
) -> Iterator[ModalDouble]:
    world = World(
        tmp_path / "modal-sandboxes",
        creates_per_min=creates_per_min,
        max_live=max_live,
        create_latency_s=create_latency_s,
    )
    world.base.mkdir(parents=True, exist_ok=True)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="modal-double", daemon=True)
    thread.start()

    async def serve() -> Server:
        # grpclib binds a server to the loop current where it is built: build it there.
        server = Server(
            [ControlServicer(world), RouterServicer(world)],
            status_details_codec=custom_detail_codec,
        )
        await server.start("127.0.0.1", 0)
        return server

    server = asyncio.run_coroutine_threadsafe(serve(), loop).result(timeout=30)
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    world.router_url = url = f"http://127.0.0.1:{port}"
    try:
        yield ModalDouble(world, loop, url)
    finally:

        async def stop() -> None:
            for box in list(world.boxes.values()):
                world.finish(box, api_pb2.GenericResult.GENERIC_STATUS_TERMINATED, 0)
            server.close()
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
