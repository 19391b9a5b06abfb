"""Engines, sessions and the Alembic schema check."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import psycopg
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from tasks.constants import PING_IDLE_S, SCHEMA_REVISION
from tasks.errors import DatabaseUnavailableError, SchemaNotCurrentError
from tasks.settings import get_settings
from tasks.store.netguard import pg_connect_args

log = logging.getLogger("playrun.db")
T = TypeVar("T")
_engines: dict[tuple[int, str], sa.Engine] = {}
_autocommit_engines: dict[tuple[int, str], sa.Engine] = {}
# One factory per engine: each sessionmaker makes a Session subclass, whose first use sets
# up its event dispatch again (0.6 ms a transaction, measured).
_factories: dict[tuple[sa.Engine, bool], sessionmaker[Session]] = {}


def _sqlite_engine(url: str) -> sa.Engine:
    path = sa.engine.make_url(url).database
    if path and path != ":memory:":
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseUnavailableError(f"cannot create the directory of the SQLite "
                                           f"database {path}: {exc.strerror}") from exc
    engine = sa.create_engine(url, connect_args={"timeout": 30}, poolclass=sa.pool.NullPool)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let us issue BEGIN ourselves; WAL lets readers run beside the one writer.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # IMMEDIATE takes the write lock up front: claims and fences are serialised.
        # Read-only sessions take a plain (deferred) BEGIN and never wait for writers.
        readonly = conn.get_execution_options().get("playrun_readonly", False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine


def _ping_when_idle(engine: sa.Engine) -> None:
    """pool_pre_ping, but only for a connection idle longer than PING_IDLE_S.

    A ping is a round trip on every checkout; a connection used a moment ago is alive
    (a server that died since fails the statement, and the pool then replaces every
    older connection). A failed ping makes the pool connect afresh, as pre_ping does.
    """

    @event.listens_for(engine, "checkin")
    def _checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["playrun_used_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        used = record.info.get("playrun_used_at")
        if used is not None and time.monotonic() - used < PING_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise sa.exc.DisconnectionError(f"stale pooled connection: {exc}") from exc


def _pg_args(url: str, *, prepare_at_once: bool = False) -> dict[str, Any]:
    """netguard's bounds; `options` the URL already gives are kept beside ours.

    Behind PgBouncer (PLAYRUN_DB_PGBOUNCER) no statement is prepared: a transaction pooler
    runs the next transaction on whichever server connection is free, where psycopg's
    prepared statement does not exist. PgBouncer also refuses the `options` startup
    parameter: its own idle_transaction_timeout stands in for ours (docs/design.md).
    """
    settings = get_settings()
    args = pg_connect_args(settings.network_timeout_s)
    given = sa.engine.make_url(url).query.get("options")
    if settings.db_pgbouncer:
        del args["options"]
        args["prepare_threshold"] = None
        return args
    if prepare_at_once:
        args["prepare_threshold"] = 0
    if given:
        args["options"] = f"{given if isinstance(given, str) else ' '.join(given)} " \
                          f"{args['options']}"
    return args


def _pg_engine(url: str, *, prepare_at_once: bool = False, **kwargs: Any) -> sa.Engine:
    """A PostgreSQL engine with the pool bounds of the settings (docs/operations.md
    "Connections"), pinged when a connection was idle."""
    settings = get_settings()
    engine = sa.create_engine(url, pool_size=settings.db_pool_size,
                              max_overflow=settings.db_max_overflow,
                              pool_timeout=settings.db_pool_timeout_s,
                              pool_recycle=settings.db_pool_recycle_s or -1,
                              connect_args=_pg_args(url, prepare_at_once=prepare_at_once),
                              **kwargs)
    _ping_when_idle(engine)
    return engine


def get_engine(url: str | None = None) -> sa.Engine:
    """One engine per process and URL (a forked worker child builds its own)."""
    url = url or get_settings().database_url
    key = (os.getpid(), url)
    engine = _engines.get(key)
    if engine is None:
        engine = _sqlite_engine(url) if url.startswith("sqlite") else _pg_engine(url)
        _engines[key] = engine
    return engine


def _autocommit_engine(url: str) -> sa.Engine:
    """PostgreSQL: a second pool whose connections stay in autocommit (nothing to switch on
    checkout, nothing to roll back on checkin).

    It keeps PLAYRUN_DB_POOL_SIZE idle (10): the gateway's request threads use it at once
    under load, and a pool of 2 closed each connection past the second on checkin, so every
    busy second started dozens of server backends (a fork and a catalog warm-up each).
    Last in, first out: a quiet process reuses the same few, and the rest idle past
    PING_IDLE_S and are pinged before their next use. Its statements are a handful of
    fixed texts, each prepared on its first use, so the server parses and plans a CTE write
    once per connection (psycopg's default waits for the fifth use).
    """
    key = (os.getpid(), url)
    engine = _autocommit_engines.get(key)
    if engine is None:
        engine = _pg_engine(url, prepare_at_once=True, pool_use_lifo=True,
                            isolation_level="AUTOCOMMIT", pool_reset_on_return=None)
        _autocommit_engines[key] = engine
    return engine


def dispose_engines() -> None:
    for engines in (_engines, _autocommit_engines):
        for key, engine in list(engines.items()):
            engine.dispose()
            del engines[key]
    _factories.clear()


@contextmanager
def session_scope(url: str | None = None, *, readonly: bool = False,
                  durable: bool = True) -> Iterator[Session]:
    """A session in one transaction: committed on success, rolled back on error.

    `readonly` sessions must not write; on SQLite they do not take the write lock.
    `durable=False` commits without waiting for the WAL flush (PostgreSQL): a crash can
    lose it, but only with every later commit, since any durable commit flushes the WAL
    before it. Use it where a lost commit is recovered like a lost worker is (docs/design.md).
    """
    engine = get_engine(url)
    factory = _factories.get((engine, readonly))
    if factory is None:
        bind = engine.execution_options(playrun_readonly=True) if readonly else engine
        factory = _factories[(engine, readonly)] = sessionmaker(bind=bind,
                                                                expire_on_commit=False)
    with factory() as session:
        with session.begin():
            if not durable and not readonly and engine.dialect.name == "postgresql":
                session.execute(_ASYNC_COMMIT)
            yield session
        for hook in session.info.pop(_AFTER_COMMIT, ()):
            try:
                hook()
            except Exception:  # committed already: a failing hook must never undo that
                log.exception("after-commit hook %r failed", hook)


@contextmanager
def autocommit(url: str | None = None, *, readonly: bool = False) -> Iterator[sa.Connection]:
    """A pooled connection in autocommit: on PostgreSQL one statement is one transaction
    and one round trip (psycopg sends BEGIN on its own before a transaction's first
    statement). SQLite still begins (see _sqlite_engine): `readonly` keeps a read off
    the write lock there."""
    with get_engine(url).connect() as conn:
        options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"}
        if readonly:
            options["playrun_readonly"] = True
        yield conn.execution_options(**options)


@contextmanager
def driver_cursor(url: str | None = None) -> Iterator[psycopg.Cursor[Any]]:
    """PostgreSQL only: a psycopg cursor on a pooled autocommit connection, each statement
    its own transaction, for the hot single-statement writes.

    SQLAlchemy's Connection and Result around one statement cost 0.5-0.8 ms of Python
    (admission, interleaved: 1.8-2.3 ms a run against 1.2-1.4 ms). psycopg's errors come
    out as SQLAlchemy's (IntegrityError, OperationalError, ...), as every caller expects;
    a connection that broke is dropped with the pool's idle ones.
    """
    engine = _autocommit_engine(url or get_settings().database_url)
    pooled = engine.raw_connection()
    try:
        driver = cast("psycopg.Connection[Any]", pooled.driver_connection)
        try:
            with driver.cursor() as cur:
                yield cur
        except psycopg.Error as exc:
            if driver.broken:
                # As SQLAlchemy does on a disconnect: this connection and every idle one
                # beside it (the server that dropped one likely dropped them all).
                pooled.invalidate(exc)
                engine.dispose()
            raise sa.exc.DBAPIError.instance(
                None, None, exc, psycopg.Error, connection_invalidated=driver.broken,
            ) from exc
    finally:
        pooled.close()


def one_statement_first(fast: Callable[[psycopg.Cursor[Any]], T | None],
                        general: Callable[[], T], *, postgres: bool) -> T:
    """A hot write's single statement on PostgreSQL, then `general` (the transaction that
    decides every case) when the statement wrote nothing (None) or on SQLite: fast paths
    cover the common case only and never restate the general path's decisions."""
    if postgres:
        with driver_cursor() as cur:
            done = fast(cur)
        if done is not None:
            return done
    return general()


def one_row(cur: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """The one row a statement returns (SQLAlchemy's `.one()` for a driver cursor)."""
    rows = cur.fetchmany(2)
    if len(rows) != 1:
        raise sa.exc.NoResultFound("no row") if not rows else sa.exc.MultipleResultsFound(
            "more than one row")
    return tuple(rows[0])


_AFTER_COMMIT = "playrun_after_commit"


def after_commit(session: Session, hook: Callable[[], None]) -> None:
    """Run `hook` once this session_scope's transaction has committed (never on rollback):
    a fact such as a terminal is counted only once it is durable."""
    session.info.setdefault(_AFTER_COMMIT, []).append(hook)


_ASYNC_COMMIT = sa.text("SET LOCAL synchronous_commit = off")
# The same for a single autocommit statement, as a CTE body it selects from (a SET would
# be a statement, and a round trip, of its own).
ASYNC_COMMIT_SQL = "SELECT set_config('synchronous_commit', 'off', true)"


def is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def sql_list(values: Iterable[str]) -> str:
    """Our own constants (states, kinds) as an SQL list of literals, in a stable order."""
    return ", ".join(f"'{v}'" for v in sorted(values))


# --- migrations -------------------------------------------------------------
# Alembic (with mako and pygments) is imported only to migrate: a worker, the gateway or
# app code checks the revision with one SELECT against SCHEMA_REVISION, and starts faster.

def alembic_config(url: str | None = None) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", "models:migrations")
    cfg.set_main_option("sqlalchemy.url", (url or get_settings().database_url).replace("%", "%%"))
    return cfg


def _migrate(step: Any, url: str | None, revision: str) -> None:
    cfg = alembic_config(url)
    with get_engine(url).connect() as conn:
        cfg.attributes["connection"] = conn
        step(cfg, revision)
        conn.commit()


def upgrade(url: str | None = None, revision: str = "head") -> None:
    from alembic import command

    _migrate(command.upgrade, url, revision)


def downgrade(url: str | None = None, revision: str = "base") -> None:
    from alembic import command

    _migrate(command.downgrade, url, revision)


def head_revision() -> str:
    """The revision this code needs (tests/integration/test_migrations.py checks it is
    Alembic's head)."""
    return SCHEMA_REVISION


def current_revision(url: str | None = None) -> str | None:
    """The database's Alembic revision; None for a database never migrated."""
    engine = get_engine(url)
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("alembic_version"):
            return None
        rows = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(rows) > 1:
        raise SchemaNotCurrentError(f"the database has several Alembic heads: {sorted(rows)}")
    return rows[0] if rows else None


def require_current_schema(url: str | None = None) -> None:
    """Refuse to go on unless the database is at the Alembic head."""
    try:
        current = current_revision(url)
    except sa.exc.OperationalError as exc:  # not a schema problem: nothing answered
        reason = " ".join(str(exc.orig).split())
        if "unsupported startup parameter" in reason:  # PgBouncer's answer to `options`
            reason += " (a PgBouncer? set PLAYRUN_DB_PGBOUNCER=true)"
        shown = get_engine(url).url.render_as_string(hide_password=True)
        raise DatabaseUnavailableError(f"cannot reach the database at {shown}: {reason}") \
            from exc
    head = head_revision()
    if current != head:
        raise SchemaNotCurrentError(
            f"database is at revision {current or 'none'}, code needs {head}; "
            "run `playrun db upgrade`"
        )


_checked: set[tuple[int, str]] = set()


def ensure_schema_once(url: str | None = None) -> None:
    """App-code entry points check the schema once per process, for a clear error."""
    url = url or get_settings().database_url
    key = (os.getpid(), url)
    if key not in _checked:
        require_current_schema(url)
        _checked.add(key)
