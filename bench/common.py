"""Shared set-up for benchmarks: a throwaway PostgreSQL database and Redis db."""

from __future__ import annotations

import os
import secrets
import statistics
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import redis

PG_BASE = os.environ.get("BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
REDIS_BASE = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379")


@contextmanager
def bench_env(redis_db: int) -> Iterator[dict[str, str]]:
    """Create and migrate a database, point PLAYRUN_* at it and a Redis db; clean up after."""
    name = f"playrun_bench_{secrets.token_hex(4)}"
    admin = PG_BASE.replace("+psycopg", "") + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    env = {
        "PLAYRUN_DATABASE_URL": f"{PG_BASE}/{name}",
        "PLAYRUN_REDIS_URL": f"{REDIS_BASE}/{redis_db}",
        "PLAYRUN_SECRET_KEY": "bench-" + secrets.token_hex(8),
        "PLAYRUN_SANDBOX_ROOT": f"/tmp/playrun-bench-{name}",
    }
    os.environ.update(env)
    redis.Redis.from_url(env["PLAYRUN_REDIS_URL"]).flushdb()
    from tasks import db

    db.upgrade(env["PLAYRUN_DATABASE_URL"])
    try:
        yield env
    finally:
        db.dispose_engines()
        redis.Redis.from_url(env["PLAYRUN_REDIS_URL"]).flushdb()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> str:
    return (f"p50 {pct(values, 50) * 1000:8.1f} ms  p99 {pct(values, 99) * 1000:8.1f} ms  "
            f"mean {statistics.mean(values) * 1000:8.1f} ms")
