"""A provider's learned create ceiling: a little under the starts that drew its first 429.

The adaptive rate's additive increase climbs back past a provider's fixed create limit
seconds after each cut, and every climb costs another 429 and another cooldown. A
ceiling shared by the fleet (one Redis key beside the bucket's rules) holds the rate
under the limit it found (permits.penalize passes the starts granted in the last
minute when they are fewer than the bucket's rate); it expires, so a raised limit is
found again.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from redis.exceptions import RedisError

from tasks.acquisition.startrate import maths
from tasks.constants import KEY_START_RATE
from tasks.store.notify import redis_client

MARGIN = 0.9  # of the rate the provider refused
TTL_S = 600  # then the bucket probes the limit again
CACHE_S = 5.0  # a process reads the shared value at most this often

_lock = threading.Lock()
_cache: dict[tuple[int, str, str], tuple[float, float | None]] = {}


def key(provider: str) -> str:
    # The bucket's hash tag: the same slot as its rules on Redis Cluster.
    return f"{KEY_START_RATE}{{{provider}}}:ceiling"


def _parse(raw: object) -> float | None:
    """Our own value, read back bounded: anything odd is no ceiling."""
    try:
        value = float(raw.decode() if isinstance(raw, bytes) else str(raw))
    except (TypeError, ValueError):
        return None
    return value if 0 < value <= maths.MAX_RATE_PER_MIN else None


def current(url: str, provider: str) -> float | None:
    """The fleet's ceiling for provider (starts a minute), None when none is in force."""
    now = time.monotonic()
    slot = (os.getpid(), url, provider)
    with _lock:
        hit = _cache.get(slot)
    if hit is not None and now - hit[0] < CACHE_S:
        return hit[1]
    try:
        raw = redis_client(url).get(key(provider))
        value = None if raw is None else _parse(raw)
    except RedisError:
        value = hit[1] if hit is not None else None  # keep what we knew; pacing goes on
    with _lock:
        _cache[slot] = (now, value)
    return value


def learn(url: str, provider: str, refused_rate: float, floor: float) -> float:
    """The provider refused a create made at refused_rate: hold the fleet under it.

    A ceiling in force only rises: a refusal at a lower rate comes from a burst inside the
    provider's window (the cut that follows handles it), and lowering the ceiling on it
    would ratchet the fleet far under the limit for the ceiling's whole life."""
    value = max(floor, refused_rate * MARGIN)
    with contextlib.suppress(RedisError):  # this process still holds it, below
        client = redis_client(url)
        held = _parse(client.get(key(provider)))
        if held is not None and held > value:
            value = held
        client.set(key(provider), f"{value:.3f}", ex=TTL_S)
    value = round(value, 3)  # what Redis holds: every process reads the same ceiling
    with _lock:
        _cache[(os.getpid(), url, provider)] = (time.monotonic(), value)
    return value
