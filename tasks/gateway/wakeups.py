"""Wakes standby calls when their assignment is ready: one Redis subscription per gateway
process (channel KEY_POOL_ASSIGNED, a member id per message). Without Redis the calls look
in the database every second instead, so a lost message only slows one start."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis.asyncio as aredis

from tasks.constants import KEY_POOL_ASSIGNED
from tasks.store import redisconn

log = logging.getLogger("playrun.gateway")

# While not subscribed, a waiting call looks again this often.
UNSUBSCRIBED_LOOK_S = 1.0
RESUBSCRIBE_S = 1.0


class Wakeups:
    def __init__(self, url: str) -> None:
        self._url = url
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self.subscribed = False

    async def wait(self, member_id: str, timeout_s: float) -> bool:
        """Until the member's assignment is announced (True), or timeout_s (shorter while
        unsubscribed)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen())
        if not self.subscribed:
            timeout_s = min(timeout_s, UNSUBSCRIBED_LOOK_S)
        event = asyncio.Event()
        self._waiting.setdefault(member_id, set()).add(event)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
            return event.is_set()
        finally:
            waiters = self._waiting.get(member_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiting[member_id]

    async def _listen(self) -> None:
        while True:
            client = redisconn.async_client(self._url, socket_keepalive=True)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(KEY_POOL_ASSIGNED)
                    self.subscribed = True
                    async for message in pubsub.listen():
                        if message.get("type") != "message":
                            continue
                        data = message.get("data")
                        member = data.decode() if isinstance(data, bytes) else str(data)
                        for event in self._waiting.get(member, ()):
                            event.set()
            except (aredis.RedisError, OSError) as exc:
                log.debug("standby wake-ups unsubscribed: %s", exc)
            finally:
                self.subscribed = False
                with contextlib.suppress(Exception):
                    await client.aclose()
            await asyncio.sleep(RESUBSCRIBE_S)
