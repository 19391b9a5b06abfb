"""Half-open connections: PostgreSQL and Redis connections whose packets stop for good.

A failover to another host, or a NAT that forgets a connection, leaves sockets that are
never reset. The packets are dropped for real (iptables on loopback, around a proxy port),
since a proxy that merely stops forwarding still has its kernel answer every keepalive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
import sqlalchemy as sa

import tasks
from bench.chaoslib import partition
from bench.chaoslib.partition import Partition
from bench.chaoslib.proxy import Proxy
from tasks.store.netguard import pg_connect_args, redis_socket_options
from tests.support.helpers import eventually
from tests.support.paths import ROOT
from tests.support.session import BASE_ENV
from tests.support.stack import Worker, worker_env

NOOP = ROOT / "examples" / "plays" / "noop.py"
TIMEOUT_S = 4.0

needs_iptables = pytest.mark.skipif(partition.skip_reason() is not None,
                                    reason=partition.skip_reason() or "")


# --- the bounds themselves (pure) ---------------------------------------------------------

@pytest.mark.parametrize("timeout_s", [4.0, 5.0, 30.0, 600.0])
def test_every_bound_fits_inside_the_timeout(timeout_s: float) -> None:
    pg = pg_connect_args(timeout_s)
    dead_after = pg["keepalives_idle"] + pg["keepalives_interval"] * pg["keepalives_count"]
    assert dead_after <= timeout_s  # an idle wait for a reply
    assert pg["tcp_user_timeout"] == timeout_s * 1000  # a send nobody acknowledges
    assert 2 <= pg["connect_timeout"] <= 10
    assert f"idle_in_transaction_session_timeout={int(timeout_s * 2000)}" in pg["options"]
    rd = redis_socket_options(timeout_s)
    assert rd["socket_timeout"] == timeout_s and rd["socket_keepalive"] is True
    assert rd["socket_connect_timeout"] <= 5 and rd["health_check_interval"] <= timeout_s


# --- against the real servers -------------------------------------------------------------

@pytest.fixture
def pg_proxy() -> Iterator[tuple[Proxy, Partition]]:
    proxy = Proxy("127.0.0.1", 5432)
    cut = Partition(proxy.port)
    yield proxy, cut
    cut.clear()
    proxy.close()


def _finishes(fn: object, timeout: float) -> tuple[bool, BaseException | None, float]:
    """Run fn on a thread; (finished in time, what it raised, seconds taken). A hang
    without the bounds would otherwise hang the test session."""
    out: dict[str, object] = {}

    def call() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:
            out["exc"] = exc

    start = time.monotonic()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout)
    exc = out.get("exc")
    return (not thread.is_alive(), exc if isinstance(exc, BaseException) else None,
            time.monotonic() - start)


@needs_iptables
def test_a_query_on_a_dead_postgres_connection_fails_instead_of_hanging(
        pg_url: str, pg_proxy: tuple[Proxy, Partition]) -> None:
    proxy, cut = pg_proxy
    conn = psycopg.connect(f"host=127.0.0.1 port={proxy.port} user=postgres dbname=test",
                           **pg_connect_args(TIMEOUT_S))
    assert conn.execute("SELECT 1").fetchone() == (1,)
    cut.cut()
    assert cut.heal(keep_dead=True) == 1
    done, exc, took = _finishes(lambda: conn.execute("SELECT 1"), 30)
    assert done, "the query hung on a connection whose packets are dropped"
    assert isinstance(exc, psycopg.OperationalError), exc
    assert took < TIMEOUT_S * 3
    # A new connection through the same address works at once.
    with psycopg.connect(f"host=127.0.0.1 port={proxy.port} user=postgres dbname=test",
                         **pg_connect_args(TIMEOUT_S)) as fresh:
        assert fresh.execute("SELECT 2").fetchone() == (2,)


@needs_iptables
def test_locks_of_a_client_that_vanished_mid_transaction_are_released(
        pg_url: str, pg_proxy: tuple[Proxy, Partition]) -> None:
    """The server ends a transaction left idle by a client it can no longer hear from
    (its row locks would otherwise block that run's every fenced write for hours)."""
    proxy, cut = pg_proxy
    key = 0x5EED_0000 + int(time.time()) % 10_000
    conn = psycopg.connect(f"host=127.0.0.1 port={proxy.port} user=postgres dbname=test",
                           **pg_connect_args(TIMEOUT_S))
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))  # inside an open transaction
    cut.cut()
    cut.heal(keep_dead=True)
    direct = sa.create_engine("postgresql+psycopg://postgres@127.0.0.1:5432/test",
                              poolclass=sa.pool.NullPool)

    def taken() -> bool:
        with direct.connect() as c:
            got = bool(c.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": key})
                       .scalar())
            if got:
                c.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            return got

    assert not taken()  # held by the vanished client's open transaction
    started = time.monotonic()
    eventually(taken, timeout=TIMEOUT_S * 2 + 20, every=0.2,
               what="the vanished client's transaction to be ended by the server")
    assert time.monotonic() - started <= TIMEOUT_S * 2 + 20
    direct.dispose()
    conn.close()


@needs_iptables
def test_redis_client_with_the_options_reconnects_past_a_dead_connection(
        redis_url: str) -> None:
    proxy = Proxy("127.0.0.1", 6379)
    cut = Partition(proxy.port)
    try:
        db = redis_url.rsplit("/", 1)[1]
        client = redis.Redis.from_url(f"redis://127.0.0.1:{proxy.port}/{db}",
                                      **redis_socket_options(TIMEOUT_S))
        assert client.ping()
        cut.cut()
        assert cut.heal(keep_dead=True) == 1
        done, exc, took = _finishes(client.ping, 30)
        # The dead connection costs one bounded wait: redis-py either retries on a new
        # connection or raises, and the next call connects afresh.
        assert done and (exc is None or isinstance(exc, redis.RedisError)), exc
        assert took < TIMEOUT_S * 3
        assert client.ping()
    finally:
        cut.clear()
        proxy.close()


@needs_iptables
@pytest.mark.slow
def test_a_worker_whose_connections_all_went_dead_serves_the_next_run(
        pg_url: str, tmp_path: Path) -> None:
    """Every connection the worker (and its beat) holds to PostgreSQL and Redis goes
    silent for good; new ones work. The same worker process serves the next run."""
    pg, rd = Proxy("127.0.0.1", 5432), Proxy("127.0.0.1", 6379)
    cuts = [Partition(pg.port), Partition(rd.port)]
    db_url = BASE_ENV["PLAYRUN_DATABASE_URL"].replace(":5432/", f":{pg.port}/")
    redis_url = BASE_ENV["PLAYRUN_REDIS_URL"].replace(":6379/", f":{rd.port}/")
    assert db_url != BASE_ENV["PLAYRUN_DATABASE_URL"] and redis_url != \
        BASE_ENV["PLAYRUN_REDIS_URL"]
    worker = Worker(worker_env(PLAYRUN_DATABASE_URL=db_url, PLAYRUN_REDIS_URL=redis_url,
                               PLAYRUN_NETWORK_TIMEOUT_S=str(TIMEOUT_S),
                               PLAYRUN_WORKER_WATCHDOG_S="0"),
                    log_path=tmp_path / "worker.log")
    try:
        worker.wait_ready()
        first = tasks.submit_run(NOOP, input={}, org_id="org-halfopen")
        eventually(lambda: tasks.get_run(first.id).status == "succeeded", timeout=60,
                   what="the first run")
        for cut in cuts:
            cut.cut()
        dead = [cut.heal(keep_dead=True) for cut in cuts]
        assert all(n > 0 for n in dead), dead  # the worker held connections to both
        second = tasks.submit_run(NOOP, input={}, org_id="org-halfopen")
        eventually(lambda: tasks.get_run(second.id).status == "succeeded", timeout=90,
                   what=f"the run after the dead connections: {tasks.get_run(second.id)}")
        assert worker.proc.poll() is None  # the same worker, not a restarted one
    finally:
        worker.stop()
        for cut in cuts:
            cut.clear()
        pg.close()
        rd.close()
