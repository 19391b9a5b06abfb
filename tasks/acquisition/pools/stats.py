"""Each pool's counters, fleet-wide in Redis (claims, misses, refills, expiries): `playrun
pool show` and beat's Prometheus exporter read them. Best effort: a lost increment only
blurs a hit rate, so Redis trouble never fails a start."""

from __future__ import annotations

import contextlib

import redis

from tasks.constants import KEY_POOL_STATS, KEY_POOL_YIELD, POOL_STATS
from tasks.store.notify import redis_client

# Runs that met a short start-rate bucket keep a provider's refills off for this long.
YIELD_MS = 5000


def count(pool: str, what: str, n: int = 1) -> None:
    assert what in POOL_STATS
    with contextlib.suppress(redis.RedisError):
        redis_client().hincrby(KEY_POOL_STATS + pool, what, n)


def counters(names: list[str]) -> dict[str, dict[str, int]]:
    """Every pool's counters (zeros where Redis has none, or does not answer)."""
    out = {name: dict.fromkeys(POOL_STATS, 0) for name in names}
    try:
        pipe = redis_client().pipeline(transaction=False)
        for name in names:
            pipe.hgetall(KEY_POOL_STATS + name)
        replies = pipe.execute()
    except redis.RedisError:
        return out
    for name, raw in zip(names, replies, strict=True):
        for key, value in (raw or {}).items():
            field = key.decode() if isinstance(key, bytes) else str(key)
            if field in POOL_STATS:
                with contextlib.suppress(TypeError, ValueError):
                    out[name][field] = int(value)
    return out


def note_waiting(provider: str) -> None:
    """A run was deferred for the start rate: refills leave the bucket to runs for a while."""
    with contextlib.suppress(redis.RedisError):
        redis_client().set(KEY_POOL_YIELD + provider, "1", px=YIELD_MS)


def runs_waiting(provider: str) -> bool:
    try:
        return bool(redis_client().exists(KEY_POOL_YIELD + provider))
    except redis.RedisError:
        return True  # no Redis, no permits either: refills wait
