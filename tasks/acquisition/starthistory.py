"""Per-minute start-rate samples in Redis, for the dashboard's last-hour chart.

After each acquire (and each applied penalty) the worker adds one to the minute's
counter of its bucket and stores the rate the bucket reported: one hash per bucket
and minute, ``<prefix>{<bucket>}:<minute>``, kept START_HISTORY_TTL_S. The minute is
Redis TIME from the reply, so every worker files a decision under the same minute.

Cost on the hot path: at most one pipelined, non-transactional round trip per
decision (HINCRBY, HSET, EXPIRE, SADD, EXPIRE), never retried and never raised; under
load far less, since decisions within a second of the last write are summed in memory
and written together by a timer (at most one round trip a second per process). None
when the bucket itself was unavailable (a degraded decision): Redis is not answering.
A process that dies loses at most its last second of samples; only the chart misses them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

import redis
from redis.exceptions import RedisError

from tasks.acquisition.startrate import Penalty, Permit
from tasks.acquisition.startrate.bucket import no_retry_client
from tasks.constants import KEY_START_HISTORY, START_HISTORY_MINUTES, START_HISTORY_TTL_S
from tasks.settings import get_settings
from tasks.store.notify import redis_client

log = logging.getLogger("playrun.starthistory")

BUCKETS_KEY = f"{KEY_START_HISTORY}buckets"
GRANTS, DENIALS, PENALTIES, RATE = "grants", "denials", "penalties", "rate"
# A history write must never hold up a start for long: a short timeout, no retry.
_SOCKET_TIMEOUT_S = 0.25
# Decisions within this long of the last write wait for one write together.
FLUSH_S = 1.0
# Buckets one chart shows at most (one per provider in practice).
MAX_BUCKETS = 16


@dataclass(frozen=True)
class Sample:
    minute: datetime  # start of the minute (UTC)
    grants: int
    denials: int
    penalties: int
    rate: float | None  # starts/min the bucket last reported in that minute


@lru_cache(maxsize=4)
def _client(url: str, pid: int) -> redis.Redis:
    return no_retry_client(redis_client(url), _SOCKET_TIMEOUT_S)


def minute_key(bucket: str, minute: int) -> str:
    return f"{KEY_START_HISTORY}{{{bucket}}}:{minute}"


class _Writer:
    """Counts of this process not yet in Redis; written by one pipelined call.

    A decision after a quiet second is written at once (one round trip); decisions
    within FLUSH_S of the last write are added up in memory and written together by a
    timer, so a busy worker pays at most one round trip a second, not one per start.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int, str], int] = {}
        self._rates: dict[tuple[str, int], float] = {}
        self._last_write = float("-inf")
        self._timer: threading.Timer | None = None
        self.writes = 0  # pipelines sent (tests, bench)

    def add(self, bucket: str, server_now_ms: int, field: str, rate: float) -> None:
        minute = server_now_ms // 60_000
        with self._lock:
            key = (bucket, minute, field)
            self._counts[key] = self._counts.get(key, 0) + 1
            self._rates[(bucket, minute)] = float(rate)
            now = time.monotonic()
            due = now - self._last_write >= FLUSH_S
            if not due and self._timer is None:
                self._timer = threading.Timer(FLUSH_S, self.flush)
                self._timer.daemon = True
                self._timer.start()
        if due:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            counts, rates = self._counts, self._rates
            self._counts, self._rates = {}, {}
            self._last_write = time.monotonic()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if not counts:
            return
        try:
            pipe = _client(get_settings().redis_url, os.getpid()).pipeline(transaction=False)
            for (bucket, minute, field), n in counts.items():
                pipe.hincrby(minute_key(bucket, minute), field, n)
            for (bucket, minute), rate in rates.items():
                pipe.hset(minute_key(bucket, minute), RATE, repr(rate))
                pipe.expire(minute_key(bucket, minute), START_HISTORY_TTL_S)
            pipe.sadd(BUCKETS_KEY, *{bucket for bucket, _ in rates})
            pipe.expire(BUCKETS_KEY, START_HISTORY_TTL_S)
            self.writes += 1
            pipe.execute()
        except RedisError as exc:  # the chart loses these points; the starts go on
            log.debug("start-rate samples not recorded: %s", exc)


_writer = _Writer()


def reset() -> None:
    """Start afresh: nothing held, no write yet (so the next decision is written at once)."""
    global _writer
    _writer = _Writer()


# A forked child (Celery prefork) must not inherit the parent's lock, timer or counts.
os.register_at_fork(after_in_child=reset)


def writer() -> _Writer:
    return _writer


def flush() -> None:
    """Write what this process still holds (tests; a worker's timer does it by itself)."""
    _writer.flush()


def record_permit(bucket: str, permit: Permit) -> None:
    if not permit.degraded:
        _writer.add(bucket, permit.server_now_ms, GRANTS if permit.granted else DENIALS,
                    permit.rate)


def record_penalty(bucket: str, penalty: Penalty) -> None:
    if penalty.applied and not penalty.degraded:
        _writer.add(bucket, penalty.server_now_ms, PENALTIES, penalty.rate)


def _int(raw: dict[bytes, bytes], field: str) -> int:
    value = raw.get(field.encode())
    try:
        return max(0, int(value)) if value is not None else 0
    except ValueError:
        return 0


def _rate(raw: dict[bytes, bytes]) -> float | None:
    value = raw.get(RATE.encode())
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def grants_last_minute(bucket: str, client: redis.Redis | None = None) -> float | None:
    """About how many permits the fleet was granted on `bucket` in the last 60 s: this
    minute's grants and the still-covered share of the last minute's. None when unknown."""
    flush()  # this process's own recent grants count too
    try:
        client = client or redis_client()
        seconds, micros = client.time()  # type: ignore[misc]
        now_s = int(seconds) + int(micros) / 1e6
        minute = int(now_s) // 60
        pipe = client.pipeline(transaction=False)
        pipe.hget(minute_key(bucket, minute), GRANTS)
        pipe.hget(minute_key(bucket, minute - 1), GRANTS)
        this, last = pipe.execute()
    except RedisError:
        return None
    covered = 1.0 - (now_s - minute * 60) / 60  # of the last minute, still in the window
    total = _count(this) + _count(last) * covered
    return total if total > 0 else None


def _count(raw: object) -> int:
    try:
        return max(0, int(raw)) if isinstance(raw, (bytes, str)) else 0
    except ValueError:
        return 0


def read_history(minutes: int = START_HISTORY_MINUTES,
                 client: redis.Redis | None = None) -> dict[str, list[Sample]]:
    """Each bucket's samples for the last `minutes` minutes (oldest first, the current
    minute last; minutes without decisions are zero). Two round trips in all."""
    client = client or redis_client()
    first = client.pipeline(transaction=False)
    first.smembers(BUCKETS_KEY)
    first.time()
    members, (seconds, _micros) = first.execute()
    buckets = sorted(b.decode("utf-8", "replace") for b in members)
    buckets = [b for b in buckets if "{" not in b and "}" not in b][:MAX_BUCKETS]
    now_minute = int(seconds) // 60
    span = range(now_minute - minutes + 1, now_minute + 1)
    pipe = client.pipeline(transaction=False)
    for bucket in buckets:
        for minute in span:
            pipe.hgetall(minute_key(bucket, minute))
    replies = iter(pipe.execute())
    out: dict[str, list[Sample]] = {}
    for bucket in buckets:
        out[bucket] = [
            Sample(datetime.fromtimestamp(minute * 60, UTC), _int(raw, GRANTS),
                   _int(raw, DENIALS), _int(raw, PENALTIES), _rate(raw))
            for minute, raw in zip(span, (next(replies) for _ in span), strict=True)]
    return out
