"""One Modal client per process, on an event loop of its own.

The SDK keeps grpclib channels and an event-loop thread that do not survive a fork, so
each worker process opens its own client on first use. Every SDK call runs on this
process's loop with a deadline: the SDK itself puts none on a create.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import modal
from modal.config import config as modal_config
from modal_proto import api_pb2

from tasks.sandbox.base import ProviderAuthError, ProviderError, TransportError
from tasks.sandbox.providers.modal.errors import mapped

T = TypeVar("T")

# With no limit the SDK sleeps through every server pushback that carries a retry hint
# and retries without bound: 0 hands each one to playrun's start-rate limiter instead.
THROTTLE_ENV = "MODAL_MAX_THROTTLE_WAIT"


@dataclass(frozen=True)
class Options:
    app_name: str
    image: str
    # The SDK's own variables to use instead of the process's (a test's loopback server).
    environ: tuple[tuple[str, str], ...] | None


class Session:
    """The process's loop, client, app and image; built lazily, never across a fork."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, name="playrun-modal", daemon=True)
        thread.start()
        self._client: Any = None
        self._app: Any = None
        self._image: Any = None
        self._lock = asyncio.Lock()

    def call(self, make: Callable[[], Awaitable[T]], *, doing: str, timeout_s: float) -> T:
        """Run an SDK coroutine here; every failure comes back as a ProviderError."""

        async def bounded() -> T:
            return await asyncio.wait_for(make(), timeout_s)

        future = asyncio.run_coroutine_threadsafe(bounded(), self.loop)
        try:
            return future.result()
        except TimeoutError as exc:
            raise TransportError(f"modal {doing}: no answer within {timeout_s:g}s") from exc
        except ProviderError:
            raise
        except Exception as exc:
            raise mapped(exc, doing) from exc

    def _setting(self, key: str) -> str:
        environ = dict(self.options.environ or ())
        name = f"MODAL_{key.upper()}"
        if name in environ:
            return environ[name]
        value = modal_config.get(key)
        return "" if value is None else str(value)

    async def client(self) -> Any:
        async with self._lock:
            if self._client is None:
                os.environ[THROTTLE_ENV] = "0"
                token_id, token_secret = self._setting("token_id"), self._setting("token_secret")
                if not (token_id and token_secret):
                    raise ProviderAuthError(
                        "modal: no token (set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET)"
                    )
                client = modal.Client(
                    self._setting("server_url"),
                    api_pb2.CLIENT_TYPE_CLIENT,
                    (token_id, token_secret),
                )
                # The context-manager entry is how the SDK opens a client it did not build.
                opened: Callable[[], Awaitable[Any]] = client.__aenter__
                await opened()
                self._client = client
            return self._client

    async def app(self) -> Any:
        client = await self.client()
        if self._app is None:
            self._app = await modal.App.lookup.aio(
                self.options.app_name, create_if_missing=True, client=client
            )
        return self._app

    def image(self) -> Any:
        if self._image is None:
            self._image = modal.Image.from_registry(self.options.image)
        return self._image


_sessions: dict[tuple[int, Options], Session] = {}
_sessions_lock = threading.Lock()


def session(options: Options) -> Session:
    """This process's session for these options (a forked child builds its own)."""
    key = (os.getpid(), options)
    with _sessions_lock:
        found = _sessions.get(key)
        if found is None:
            found = _sessions[key] = Session(options)
        return found
