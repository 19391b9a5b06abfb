"""What the gateway's app checks for each request of an attempt: the budgets (requests in
flight, the request and byte buckets) and the hard budget of refusals, kept in Redis for
the whole fleet (store.py), or in this process's memory (budgets.py, refusals.py).

Redis trouble never reaches a runner: a call Redis does not answer (down, slower than
store.TIMEOUT_S, an odd reply) is answered from memory, and for RETRY_S after it every
call is, so a dead Redis costs no latency per request. One warning says so, and one more
when Redis answers again. Meanwhile each process keeps its own budgets, as before they
were shared.

Nothing waits for a release: it goes with the next pipeline (pipe.py). A release lost (a
process killed, Redis down) is a hold that expires on its own after maths.HOLD_MS.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count as counter

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tasks.errors import GatewayAbuseError, GatewayBudgetReplyError, GatewayRateLimitedError
from tasks.gateway.budgets import Budgets, past_the_rate, too_many_in_flight
from tasks.gateway.fleet import maths
from tasks.gateway.fleet.store import FleetStore, Key, client_for
from tasks.gateway.refusals import ABUSE_MESSAGE, Count
from tasks.settings import Settings

log = logging.getLogger("playrun.gateway")

RETRY_S = 5.0  # after Redis failed to answer, budgets stay in memory this long
_UNAVAILABLE = (RedisError, OSError, GatewayBudgetReplyError)


@dataclass(frozen=True, slots=True)
class Hold:
    """An admitted request, to release once it is answered."""

    key: Key
    rid: str | None = None  # its id in the fleet's in-flight set; None: held in memory


class Limits:
    """admit / release / count for one gateway process; without a store, all in memory."""

    def __init__(self, local: Budgets, store: FleetStore | None = None, *,
                 retry_s: float = RETRY_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.local = local
        self.store = store
        self.degraded_calls = 0  # answered from memory while Redis did not answer
        self._retry_s = retry_s
        self._monotonic = monotonic
        self._skip_until = float("-inf")
        self._down = False
        self._ids = counter()
        self._id_prefix = os.urandom(5).hex() + ":"  # request ids unique across the fleet
        if store is not None:
            store.pipe.on_error = lambda exc: self._degrade(exc, "release")

    async def admit(self, key: Key, size: int) -> Hold:
        """Take one request of `size` bytes, or raise GatewayRateLimitedError (with how
        long to wait) or GatewayAbuseError (the attempt was failed)."""
        store = self._reachable()
        if store is not None:
            rid = self._id_prefix + str(next(self._ids))
            try:
                answer, wait_us = await store.admit(key, size, rid)
            except _UNAVAILABLE as exc:
                if isinstance(exc, RedisTimeoutError):  # it may have run: let it go
                    store.release(key, rid)
                self._degrade(exc, "admit")
            else:
                self._answered()
                if answer == maths.ADMITTED:
                    return Hold(key, rid)
                raise self._refusal(answer, wait_us)
        self.local.admit(key, size)
        return Hold(key)

    def release(self, hold: Hold) -> None:
        """The request was answered (called on the event loop; never waits for Redis)."""
        if hold.rid is None:
            self.local.release(hold.key)
        elif self.store is not None:
            self.store.release(hold.key, hold.rid)

    async def count(self, key: Key, code: str, keep_s: float) -> Count | None:
        """Count one refusal fleet-wide (refusals.SharedCount); None: count it in memory."""
        store = self._reachable()
        if store is None:
            return None
        try:
            refused = await store.refuse(key, code, round(keep_s * 1_000_000))
        except _UNAVAILABLE as exc:
            self._degrade(exc, "refuse")
            return None
        self._answered()
        return Count(tripped=refused.answer == maths.TRIPPED,
                     failed=refused.answer == maths.ALREADY_FAILED, totals=refused.totals)

    async def drain(self) -> None:
        """Until the queued releases are sent (tests, and a process that stops)."""
        if self.store is not None:
            await self.store.pipe.drain()

    def _refusal(self, answer: int, wait_us: int) -> GatewayRateLimitedError | GatewayAbuseError:
        if answer == maths.FAILED:
            return GatewayAbuseError(ABUSE_MESSAGE)
        if answer == maths.IN_FLIGHT:
            return too_many_in_flight(self.local.max_in_flight)
        return past_the_rate(wait_us / 1_000_000)

    def _reachable(self) -> FleetStore | None:
        if self.store is None:
            return None
        if self._monotonic() < self._skip_until:
            self.degraded_calls += 1
            return None
        return self.store

    def _degrade(self, exc: Exception, op: str) -> None:
        self.degraded_calls += 1
        self._skip_until = self._monotonic() + self._retry_s
        if not self._down:
            self._down = True
            log.warning(
                "gateway budgets: Redis did not answer (%s: %s: %s); this process keeps "
                "each attempt's budgets in memory, and tries Redis again every %g s",
                op, type(exc).__name__, exc, self._retry_s)

    def _answered(self) -> None:
        if self._down:
            self._down = False
            log.warning("gateway budgets: Redis answers again; budgets are fleet-wide")


def limits_for(settings: Settings) -> Limits:
    """The app's limits: in Redis (PLAYRUN_REDIS_URL) unless
    PLAYRUN_GATEWAY_SHARED_BUDGETS is off, over this process's in-memory budgets."""
    byte_burst = float(settings.gateway_max_body_bytes) * 2
    local = Budgets(settings.gateway_attempt_requests_per_s,
                    settings.gateway_attempt_request_burst,
                    settings.gateway_attempt_bytes_per_s, byte_burst,
                    settings.gateway_attempt_in_flight)
    if not settings.gateway_shared_budgets:
        return Limits(local)
    params = maths.Params.of(
        settings.gateway_attempt_requests_per_s, settings.gateway_attempt_request_burst,
        settings.gateway_attempt_bytes_per_s, byte_burst, settings.gateway_attempt_in_flight,
        settings.gateway_abuse_refusals, settings.gateway_abuse_window_s)
    url = settings.redis_url
    return Limits(local, FleetStore(lambda: client_for(url), params))
