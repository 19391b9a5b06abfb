"""The fleet-wide gateway budgets in Redis: one Lua script per operation (lua/admit.lua,
lua/refuse.lua, each atomic, after lua/prelude.lua), and a release that is one ZREM.

An attempt's keys share the hash tag `{<run id>:<generation>}`, so the scripts run on
Redis Cluster too. Only NOSCRIPT re-sends a call (nothing ran); a timeout may have run the
script and propagates to the caller (limits.py), which answers from memory instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

from tasks.constants import KEY_GATEWAY
from tasks.errors import GatewayBudgetReplyError
from tasks.gateway.fleet import maths
from tasks.gateway.fleet.maths import Params

Key = tuple[str, int]  # (run id, generation): one attempt
# A Redis that answers slower than this is unavailable to the gateway: the budgets are
# kept in memory until it answers again (limits.py).
TIMEOUT_S = 0.5


@dataclass(frozen=True)
class Script:
    body: str
    sha: str


def _lua(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


@cache
def script(name: str) -> Script:
    body = _lua("prelude") + _lua(name)
    return Script(body, hashlib.sha1(body.encode("utf-8")).hexdigest())


def client_for(url: str) -> aredis.Redis:
    """The gateway process's own pool: commands are never re-sent (a timed-out admit may
    have run), and a slow Redis costs a request at most TIMEOUT_S."""
    client: aredis.Redis = aredis.Redis.from_url(
        url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S,
        socket_keepalive=True, retry=Retry(NoBackoff(), 0))
    return client


def _packed(*values: int) -> bytes:
    if any(not 0 <= v < maths.EXACT for v in values):
        raise ValueError(f"gateway budget numbers must stay below 2^53: {values!r}")
    return struct.pack(f"<{len(values)}d", *values)


@dataclass(frozen=True)
class Refused:
    """The answer of refuse: counted, or this refusal failed the attempt (with its
    refusals by code), or the attempt was failed already."""

    answer: int
    totals: dict[str, int]


class FleetStore:
    """admit / release / refuse against one Redis, for one gateway's parameters."""

    def __init__(self, connect: Callable[[], aredis.Redis], params: Params, *,
                 prefix: str = KEY_GATEWAY) -> None:
        """connect: a new client (e.g. client_for(url)), made once per event loop, since
        an asyncio connection serves only the loop it was made on."""
        self._connect = connect
        self._clients: tuple[asyncio.AbstractEventLoop, aredis.Redis] | None = None
        self.params = params
        self.prefix = prefix
        self._admit_args = _packed(
            params.request_rate, params.request_burst, params.byte_rate, params.byte_burst,
            params.byte_cap, params.max_in_flight, params.hold_us, params.idle_ms)
        self._refuse_args = _packed(params.limit, params.window_ms, maths.FAILED_MIN_US,
                                    params.idle_ms)

    @property
    def client(self) -> aredis.Redis:
        loop = asyncio.get_running_loop()
        if self._clients is None or self._clients[0] is not loop:
            self._clients = (loop, self._connect())
        return self._clients[1]

    def keys(self, key: Key) -> tuple[str, str, str]:
        """The attempt's bucket, abuse and flight keys."""
        base = f"{self.prefix}{{{key[0]}:{key[1]}}}:"
        return base + "bucket", base + "abuse", base + "flight"

    async def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        s, client = script(name), self.client
        try:
            return await client.evalsha(s.sha, len(keys), *keys, *args)  # type: ignore[misc]
        except NoScriptError:
            await client.script_load(s.body)
            return await client.evalsha(s.sha, len(keys), *keys, *args)  # type: ignore[misc]

    async def admit(self, key: Key, size: int, rid: str, *,
                    now_us: int | None = None) -> tuple[int, int]:
        """(answer, wait in us), the answers of maths.admit."""
        reply = await self._run("admit", self.keys(key), (
            self._admit_args, max(0, size), rid, "" if now_us is None else now_us))
        try:
            answer, wait = (int(v) for v in reply)
        except (TypeError, ValueError) as exc:
            raise GatewayBudgetReplyError(f"admit answered {reply!r:.200}") from exc
        if answer not in (maths.ADMITTED, maths.IN_FLIGHT, maths.WAIT, maths.FAILED):
            raise GatewayBudgetReplyError(f"admit answered {reply!r:.200}")
        return answer, wait

    async def release(self, holds: Sequence[tuple[Key, str]]) -> None:
        """Forget admitted requests: one round trip for all of them."""
        pipe = self.client.pipeline(transaction=False)
        for key, rid in holds:
            pipe.zrem(self.keys(key)[2], rid)
        await pipe.execute()

    async def refuse(self, key: Key, code: str, keep_us: int, *,
                     now_us: int | None = None) -> Refused:
        _, abuse, _ = self.keys(key)
        reply = await self._run("refuse", (abuse,), (
            self._refuse_args, code, int(keep_us), "" if now_us is None else now_us))
        try:
            answer = int(reply[0])
            rest = reply[1:]
            totals = {(c.decode() if isinstance(c, bytes) else str(c)): int(n)
                      for c, n in zip(rest[::2], rest[1::2], strict=True)}
        except (TypeError, ValueError, IndexError) as exc:
            raise GatewayBudgetReplyError(f"refuse answered {reply!r:.200}") from exc
        if answer not in (maths.COUNTED, maths.TRIPPED, maths.ALREADY_FAILED):
            raise GatewayBudgetReplyError(f"refuse answered {reply!r:.200}")
        return Refused(answer, totals)
