"""Per-minute start-rate samples in Redis, for the dashboard's last-hour chart.

After each acquire (and each applied penalty) the worker adds one to the minute's
counter of its bucket and stores the rate the bucket reported: one hash per bucket
and minute, ``<prefix>{<bucket>}:<minute>``, kept START_HISTORY_TTL_S. The minute is
Redis TIME from the reply, so every worker files a decision under the same minute.

Cost on the hot path: one pipelined, non-transactional round trip (HINCRBY, HSET,
EXPIRE, SADD, EXPIRE), never retried and never raised; none when the bucket itself
was unavailable (a degraded decision), since Redis is then not answering anyway.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

import redis
from redis.exceptions import RedisError

from tasks.acquisition.startrate import Penalty, Permit
from tasks.acquisition.startrate.bucket import no_retry_client
from tasks.constants import KEY_START_HISTORY, START_HISTORY_MINUTES, START_HISTORY_TTL_S
from tasks.notify import redis_client
from tasks.settings import get_settings

log = logging.getLogger("playrun.starthistory")

BUCKETS_KEY = f"{KEY_START_HISTORY}buckets"
GRANTS, DENIALS, PENALTIES, RATE = "grants", "denials", "penalties", "rate"
# A history write must never hold up a start for long: a short timeout, no retry.
_SOCKET_TIMEOUT_S = 0.25
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


def _count(bucket: str, server_now_ms: int, field: str, rate: float) -> None:
    key = minute_key(bucket, server_now_ms // 60_000)
    try:
        pipe = _client(get_settings().redis_url, os.getpid()).pipeline(transaction=False)
        pipe.hincrby(key, field, 1)
        pipe.hset(key, RATE, repr(float(rate)))
        pipe.expire(key, START_HISTORY_TTL_S)
        pipe.sadd(BUCKETS_KEY, bucket)
        pipe.expire(BUCKETS_KEY, START_HISTORY_TTL_S)
        pipe.execute()
    except RedisError as exc:  # the chart loses a point; the start goes on
        log.debug("start-rate sample for %r not recorded: %s", bucket, exc)


def record_permit(bucket: str, permit: Permit) -> None:
    if not permit.degraded:
        _count(bucket, permit.server_now_ms, GRANTS if permit.granted else DENIALS,
               permit.rate)


def record_penalty(bucket: str, penalty: Penalty) -> None:
    if penalty.applied and not penalty.degraded:
        _count(bucket, penalty.server_now_ms, PENALTIES, penalty.rate)


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
