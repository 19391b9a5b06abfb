"""Shared fixtures: a private Redis db number and a fresh PostgreSQL database per session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

REDIS_BASE = os.environ.get("PLAYRUN_TEST_REDIS", "redis://127.0.0.1:6379")


def _claim_redis_db() -> int:
    """Take the first Redis db (1..15) no other test session holds."""
    for db in range(1, 16):
        client = redis.Redis.from_url(f"{REDIS_BASE}/{db}")
        if client.set("playrun:test-session", os.getpid(), nx=True, ex=3600):
            client.close()
            return db
        client.close()
    raise RuntimeError("no free Redis db number between 1 and 15")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    db = _claim_redis_db()
    url = f"{REDIS_BASE}/{db}"
    yield url
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator["redis.Redis[bytes]"]:
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    yield client
    # Keep the session marker; drop everything a test left behind.
    for key in client.scan_iter(match="*"):
        if key != b"playrun:test-session":
            client.delete(key)
    client.close()
