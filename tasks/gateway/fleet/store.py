"""The fleet-wide gateway budgets in Redis: one Lua script per operation (lua/admit.lua,
lua/refuse.lua, each atomic, after lua/prelude.lua), and a release that is one ZREM (a
single command is atomic on its own), all sent through pipe.py.

An attempt's keys share the hash tag `{<run id>:<generation>}`, so the scripts run on
Redis Cluster too. Only NOSCRIPT re-sends a call (nothing ran); a timeout may have run the
script and propagates to the caller (limits.py), which answers from memory instead.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tasks.constants import KEY_GATEWAY
from tasks.errors import GatewayBudgetReplyError
from tasks.gateway.fleet import maths
from tasks.gateway.fleet.maths import Params
from tasks.gateway.fleet.pipe import Pipe
from tasks.gateway.fleet.scripts import script
from tasks.store import redisconn

Key = tuple[str, int]  # (run id, generation): one attempt
# A Redis that answers slower than this is unavailable to the gateway: the budgets are
# kept in memory until it answers again (limits.py).
TIMEOUT_S = 0.5


def client_for(url: str) -> aredis.Redis:
    """The gateway process's own pool: commands are never re-sent (a timed-out admit may
    have run), and a slow Redis costs a request at most TIMEOUT_S."""
    client: aredis.Redis = redisconn.async_client(
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
        """connect: a new client (e.g. client_for(url)), made once per event loop."""
        self.pipe = Pipe(connect)
        self.params = params
        self.prefix = prefix
        self._admit_args = _packed(
            params.request_rate, params.request_burst, params.byte_rate, params.byte_burst,
            params.byte_cap, params.max_in_flight, params.hold_us, params.idle_ms)
        self._refuse_args = _packed(params.limit, params.window_ms, maths.FAILED_MIN_US,
                                    params.idle_ms)

    @property
    def client(self) -> aredis.Redis:
        return self.pipe.client

    def keys(self, key: Key) -> tuple[str, str, str]:
        """The attempt's bucket, abuse and flight keys."""
        base = f"{self.prefix}{{{key[0]}:{key[1]}}}:"
        return base + "bucket", base + "abuse", base + "flight"

    async def admit(self, key: Key, size: int, rid: str, *,
                    now_us: int | None = None) -> tuple[int, int]:
        """(answer, wait in us), the answers of maths.admit."""
        reply = await self.pipe.call(script("admit"), self.keys(key), (
            self._admit_args, max(0, size), rid, "" if now_us is None else now_us))
        try:
            answer, wait = (int(v) for v in reply)
        except (TypeError, ValueError) as exc:
            raise GatewayBudgetReplyError(f"admit answered {reply!r:.200}") from exc
        if answer not in (maths.ADMITTED, maths.IN_FLIGHT, maths.WAIT, maths.FAILED):
            raise GatewayBudgetReplyError(f"admit answered {reply!r:.200}")
        return answer, wait

    def release(self, key: Key, rid: str) -> None:
        """Forget an admitted request, with the next pipeline (nobody waits for it)."""
        self.pipe.zrem_soon(self.keys(key)[2], rid)

    async def refuse(self, key: Key, code: str, keep_us: int, *,
                     now_us: int | None = None) -> Refused:
        _, abuse, _ = self.keys(key)
        reply = await self.pipe.call(script("refuse"), (abuse,), (
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
