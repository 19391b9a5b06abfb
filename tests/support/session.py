"""The session's PostgreSQL and Redis, set up on first import.

Importing this claims a private Redis db number, names a fresh PostgreSQL database (created
and migrated by the `pg_url` fixture) and puts both URLs in the environment. conftest
imports it before it collects the first test outside tests/unit; unit tests never do.
"""

from __future__ import annotations

import os
import secrets

import redis

from tasks.host.processes import pid_alive
from tasks.settings import reset_settings
from tests.support.env import LOCAL_ENV
from tests.support.private_servers import admin_url, database_url, ensure

# The configured servers, or private ones from wheels when those do not answer.
PG_BASE, REDIS_BASE, PRIVATE_SERVERS = ensure(
    os.environ.get("PLAYRUN_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432"),
    os.environ.get("PLAYRUN_TEST_REDIS", "redis://127.0.0.1:6379"),
)
SESSION_MARK = "playrun:test-session"


def _dbs_in_use() -> set[int]:
    """Dbs other clients are connected to (e.g. workers a killed session left running)."""
    client = redis.Redis.from_url(f"{REDIS_BASE}/0")
    try:
        return {int(c.get("db", 0)) for c in client.client_list()}
    finally:
        client.close()


def _claim_redis_db() -> int:
    """Take the first Redis db (1..11) no live test session holds; a db whose holder
    died (a killed session) is flushed and taken over, unless something still uses it."""
    busy = _dbs_in_use()
    for db in range(1, 12):  # 12-15 are left to bench/ scripts
        if db in busy:
            continue
        client = redis.Redis.from_url(f"{REDIS_BASE}/{db}")
        try:
            if client.set(SESSION_MARK, os.getpid(), nx=True, ex=6 * 3600):
                return db
            holder = client.get(SESSION_MARK)
            if holder is not None and not pid_alive(int(holder)):
                client.flushdb()
                if client.set(SESSION_MARK, os.getpid(), nx=True, ex=6 * 3600):
                    return db
        finally:
            client.close()
    raise RuntimeError("no free Redis db number between 1 and 11")


REDIS_DB = _claim_redis_db()
TEST_REDIS_URL = f"{REDIS_BASE}/{REDIS_DB}"


def pg_database(name: str) -> str:
    """The URL of database `name` on the session's PostgreSQL."""
    return database_url(PG_BASE, name)


PG_NAME = f"playrun_test_{os.getpid()}_{secrets.token_hex(3)}"
TEST_PG_URL = pg_database(PG_NAME)

BASE_ENV = {
    **LOCAL_ENV,
    "PLAYRUN_REDIS_URL": TEST_REDIS_URL,
    "PLAYRUN_DATABASE_URL": TEST_PG_URL,
}
os.environ.update(BASE_ENV)
reset_settings()  # a unit test may have read the settings before these URLs were set


def psql(sql: str) -> None:
    import psycopg

    with psycopg.connect(admin_url(PG_BASE), autocommit=True) as c:
        c.execute(sql)


def drop_orphaned_databases() -> None:
    """Databases of killed test sessions (their pid is gone) are dropped."""
    import psycopg

    with psycopg.connect(admin_url(PG_BASE), autocommit=True) as c:
        names = [
            r[0]
            for r in c.execute(
                "select datname from pg_database where datname like 'playrun_test_%'"
            )
        ]
    for name in names:
        parts = name.split("_")
        if len(parts) >= 3 and parts[2].isdigit() and not pid_alive(int(parts[2])):
            psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
