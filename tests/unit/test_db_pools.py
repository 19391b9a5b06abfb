"""The PostgreSQL pools take their bounds from the settings, and PLAYRUN_DB_PGBOUNCER
drops what a transaction pooler cannot serve (engines are built without connecting)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tasks.settings import reset_settings
from tasks.store import db

URL = "postgresql+psycopg://playrun@127.0.0.1:1/playrun"


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    db.dispose_engines()
    yield monkeypatch
    db.dispose_engines()
    monkeypatch.undo()
    reset_settings()


def test_both_pools_take_their_bounds_from_the_settings(settings: pytest.MonkeyPatch) -> None:
    for name, value in (("POOL_SIZE", "3"), ("MAX_OVERFLOW", "2"), ("POOL_TIMEOUT_S", "7"),
                        ("POOL_RECYCLE_S", "600")):
        settings.setenv(f"PLAYRUN_DB_{name}", value)
    reset_settings()
    for engine in (db.get_engine(URL), db._autocommit_engine(URL)):
        pool = engine.pool
        assert (pool.size(), pool._max_overflow, pool._timeout, pool._recycle) == (  # type: ignore[attr-defined]
            3, 2, 7.0, 600.0)


def test_defaults_keep_thirty_connections_a_process_and_never_recycle(
        settings: pytest.MonkeyPatch) -> None:
    reset_settings()
    pools = [db.get_engine(URL).pool, db._autocommit_engine(URL).pool]
    assert sum(p.size() + p._max_overflow for p in pools) == 30  # type: ignore[attr-defined]
    assert {p._recycle for p in pools} == {-1}  # type: ignore[attr-defined]


def test_pgbouncer_mode_prepares_nothing_and_sends_no_startup_options(
        settings: pytest.MonkeyPatch) -> None:
    reset_settings()
    direct = db._pg_args(URL + "?options=-c%20search_path%3Dapp")
    assert "idle_in_transaction_session_timeout" in direct["options"]
    assert direct["options"].startswith("-c search_path=app ")
    assert "prepare_threshold" not in direct
    # The hot single statements' pool prepares each on its first use (no parse after it).
    assert db._pg_args(URL, prepare_at_once=True)["prepare_threshold"] == 0
    settings.setenv("PLAYRUN_DB_PGBOUNCER", "true")
    reset_settings()
    for bounced in (db._pg_args(URL), db._pg_args(URL, prepare_at_once=True)):
        assert "options" not in bounced and bounced["prepare_threshold"] is None
    assert bounced["keepalives"] == 1 and bounced["connect_timeout"] >= 2
