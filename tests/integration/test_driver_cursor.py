"""tasks.store.db.driver_cursor: the hot one-statement writes on a psycopg cursor, with
SQLAlchemy's errors and a pool that drops a connection that broke."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tasks.store import db


def _bundle(digest: str) -> None:
    with db.driver_cursor() as cur:
        cur.execute("INSERT INTO play_bundles (digest, source, size) VALUES (%s, 'x', 1)",
                    (digest,))


def test_each_statement_commits_on_its_own_and_errors_are_sqlalchemys(pg_url: str) -> None:
    digest = uuid.uuid4().hex
    _bundle(digest)
    with db.session_scope(pg_url, readonly=True) as session:  # another connection sees it
        assert session.scalar(sa.text("SELECT count(*) FROM play_bundles WHERE digest = :d"),
                              {"d": digest}) == 1
    with pytest.raises(sa.exc.IntegrityError) as caught:
        _bundle(digest)
    assert "play_bundles" in str(caught.value.orig)
    with db.driver_cursor() as cur:  # the same pooled connection: nothing left open
        cur.execute("SELECT count(*), pg_current_xact_id_if_assigned() IS NULL "
                    "FROM play_bundles WHERE digest = %s", (digest,))
        assert db.one_row(cur) == (1, True)


def _pid(cur: psycopg.Cursor[Any]) -> int:
    cur.execute("SELECT pg_backend_pid()")
    (pid,) = db.one_row(cur)
    return int(pid)


def test_a_server_that_dropped_the_pool_costs_one_failed_call(pg_url: str) -> None:
    db.dispose_engines()  # a pool of this test's own: earlier tests left idle connections
    with db.driver_cursor() as a, db.driver_cursor() as b:  # two pooled connections
        pids = {_pid(a), _pid(b)}
    with db.driver_cursor() as cur:
        assert _pid(cur) in pids  # pooled: one of the same backends again
    with db.session_scope(pg_url) as session:  # as a server restart would
        session.execute(sa.text("SELECT pg_terminate_backend(p) FROM unnest(:ps) p"),
                        {"ps": list(pids)})
    with pytest.raises(sa.exc.OperationalError) as caught, db.driver_cursor() as cur:
        cur.execute("SELECT 1")
    assert caught.value.connection_invalidated
    # The other idle connection, used a moment ago (so not pinged), went with the pool.
    with db.driver_cursor() as a, db.driver_cursor() as b:
        assert not {_pid(a), _pid(b)} & pids


def test_one_row_wants_exactly_one(pg_url: str) -> None:
    with db.driver_cursor() as cur:
        cur.execute("SELECT 1 WHERE false")
        with pytest.raises(sa.exc.NoResultFound):
            db.one_row(cur)
        cur.execute("SELECT generate_series(1, 2)")
        with pytest.raises(sa.exc.MultipleResultsFound):
            db.one_row(cur)
