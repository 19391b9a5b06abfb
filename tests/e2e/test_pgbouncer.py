"""The whole run lifecycle through PgBouncer in transaction pooling mode: a real worker
(with beat), the real gateway and this test process all reach PostgreSQL only through a
pgbouncer with few server connections (tests/support/pgbouncer.py); migrations ran
directly. What a user sees: outcomes, the ledger, receipts, sheet rows, the reaper's
verdict, and PgBouncer's own view of who is connected."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import tasks
from models import Attempt, db_now
from tasks.errors import DatabaseUnavailableError
from tasks.host.processes import free_port
from tasks.settings import reset_settings
from tasks.store import db
from tests.support.helpers import eventually, kinds
from tests.support.paths import PLAYS, ROOT
from tests.support.pgbouncer import SERVER_POOL, PgBouncer, start_entrypoint
from tests.support.runs import FAST_STARTS, HOST_FILES, close_open_runs
from tests.support.session import PG_NAME
from tests.support.sheets import PLAY_NAME, SHEET_PLAY
from tests.support.stack import Gateway, Worker, worker_env

pytestmark = pytest.mark.slow
HELLO = ROOT / "examples" / "plays" / "hello.py"
STEPS = PLAYS / "steps.py"
ORG_PREFIX = "pgb-"


def org() -> str:
    return f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def bounced(pgbouncer: PgBouncer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, str]]:
    """The settings of every process of this module: the database through PgBouncer, and a
    gateway of its own (the session's one, on the direct URL, may be serving too)."""
    sock = tmp_path_factory.mktemp("pgb-gateway") / "sock" / "gateway.sock"
    env = {"PLAYRUN_DATABASE_URL": pgbouncer.url(PG_NAME), "PLAYRUN_DB_PGBOUNCER": "true",
           "PLAYRUN_GATEWAY_URL": f"http://127.0.0.1:{free_port()}",
           "PLAYRUN_GATEWAY_SOCKET": str(sock)}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        reset_settings()
        db.dispose_engines()
        yield env
        db.dispose_engines()
    reset_settings()


@pytest.fixture(scope="module")
def gateway(bounced: dict[str, str]) -> Iterator[Gateway]:
    """Overrides the session's gateway for this module: runners push through PgBouncer."""
    g = Gateway(worker_env(**bounced))
    yield g
    g.stop()


@pytest.fixture(scope="module")
def worker(bounced: dict[str, str], gateway: Gateway) -> Iterator[Worker]:
    # Process isolation: the receipts play counts its paid calls in a host file.
    w = Worker(worker_env(**bounced, **FAST_STARTS, **HOST_FILES), concurrency=2, beat=True)
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()
        close_open_runs(ORG_PREFIX)


def test_a_run_goes_end_to_end_through_pgbouncer(worker: Worker,
                                                 pgbouncer: PgBouncer) -> None:
    # 13 s: the gateway renews the first lease (14 s) from the heartbeats after about 11 s.
    handle = tasks.submit_run(PLAYS / "sleepy.py", input={"seconds": 13}, org_id=org())
    assert handle.wait(timeout=60).status == "succeeded"
    eventually(lambda: "capacity.released" in kinds(handle.id), what="release")
    seq = kinds(handle.id)
    assert seq[:4] == ["run.admitted", "attempt.started", "sandbox.requested", "sandbox.live"]
    assert seq[-3:] == ["run.succeeded", "sandbox.deleted", "capacity.released"]
    # Heartbeats renewed the attempt's lease through the gateway while the play slept.
    attempt = tasks.get_run(handle.id).attempts[0]
    with db.session_scope(readonly=True) as s:
        beat = s.scalar(sa.select(Attempt.last_heartbeat_at).where(
            Attempt.run_id == handle.id))
    assert beat is not None and attempt.started_at is not None and beat > attempt.started_at
    # PgBouncer served the worker's and the gateway's connections on its few servers.
    clients = [c for c in pgbouncer.show("CLIENTS") if c["database"] == PG_NAME]
    assert len(clients) >= 3
    assert len([s for s in pgbouncer.show("SERVERS") if s["database"] == PG_NAME]) \
        <= SERVER_POOL


def test_receipts_are_reused_through_pgbouncer(worker: Worker, tmp_path: Path) -> None:
    org_id, counter = org(), tmp_path / "calls.txt"
    first = tasks.submit_run(STEPS, input={"counter": str(counter), "tag": "a"}, org_id=org_id)
    assert first.wait(timeout=60).output == {"out": {"tag": "a"}}
    second = tasks.submit_run(STEPS, input={"counter": str(counter), "tag": "b"},
                              org_id=org_id)
    assert second.wait(timeout=60).output == {"out": {"tag": "a"}}
    assert counter.read_text().count("\n") == 1
    [receipt] = tasks.receipts(org_id)
    assert (receipt.status, receipt.run_id, receipt.claims) == ("completed", first.id, 1)


def test_a_sheet_fills_through_pgbouncer(worker: Worker) -> None:
    org_id = org()
    rows = [{"domain": f"p{i:03d}.com", **({"fail": True} if i == 7 else {})}
            for i in range(300)]
    result = tasks.submit_run(SHEET_PLAY, input={"rows": rows}, org_id=org_id).wait(timeout=90)
    assert result.status == "succeeded", result.error
    assert (result.output["enriched"], result.output["failed"]) == (300, 1)
    stored = tasks.sheet_rows(org_id, PLAY_NAME, "companies")
    assert len(stored) == 300
    assert {r.key for r in stored if r.status == "failed"} == {"p007.com"}


def test_the_reaper_settles_a_frozen_runner_through_pgbouncer(worker: Worker,
                                                              tmp_path: Path) -> None:
    org_id, counter = org(), tmp_path / "calls.txt"
    handle = tasks.submit_run(STEPS, input={"counter": str(counter), "mode": "stop"},
                              org_id=org_id)
    eventually(lambda: counter.exists(), timeout=60, what="the step to start")
    with db.session_scope() as s:  # past its deadline, as a runner frozen for an hour
        s.execute(sa.update(Attempt).where(Attempt.run_id == handle.id).values(
            runner_deadline=db_now(-3600), lease_expires_at=db_now(-1)))
    result = handle.wait(timeout=60)
    assert (result.status, result.code) == ("failed", "RUNTIME_RUNNER_LOST")
    assert "could not be inspected" in (result.error or "")  # the reaper's backstop
    eventually(lambda: [r.status for r in tasks.receipts(org_id)] == ["released"],
               timeout=60, what="the receipt's release")
    eventually(lambda: "capacity.released" in kinds(handle.id), what="the lease's release")


def test_hot_statements_are_never_prepared_behind_pgbouncer(bounced: dict[str, str],
                                                            pgbouncer: PgBouncer
                                                            ) -> None:
    """psycopg prepares a statement run 5 times on a connection; behind a transaction
    pooler its next run may land on another server connection. Eight threads repeat one
    statement through the process's pools; psycopg's default is the control."""
    errors: list[str] = []

    def ours() -> None:
        for i in range(30):
            try:
                with db.driver_cursor() as cur:
                    cur.execute("SELECT %s::int + count(*) FROM runs", (i,))
                    cur.fetchone()
                with db.session_scope(readonly=True) as s:
                    s.execute(sa.text("SELECT count(*) FROM attempts WHERE generation > :g"),
                              {"g": i}).scalar_one()
            except sa.exc.DBAPIError as exc:
                errors.append(str(exc.orig))

    threads = [threading.Thread(target=ours) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _default_psycopg_errors(pgbouncer.url(PG_NAME))


def _default_psycopg_errors(url: str) -> list[str]:
    errors: list[str] = []

    def theirs() -> None:
        with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
            for i in range(30):
                try:
                    conn.execute("SELECT %s::int", (i,)).fetchone()
                except psycopg.Error as exc:
                    errors.append(str(exc))

    threads = [threading.Thread(target=theirs) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_without_the_setting_a_pgbouncer_is_named_in_the_error(
        bounced: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAYRUN_DB_PGBOUNCER", "false")
    reset_settings()
    db.dispose_engines()  # the engines of the earlier tests were built with the setting
    url = bounced["PLAYRUN_DATABASE_URL"]
    try:
        with pytest.raises(DatabaseUnavailableError) as refused:
            db.require_current_schema(url)
        message: Any = refused.value.args[0]
        assert "unsupported startup parameter: options" in message
        assert "set PLAYRUN_DB_PGBOUNCER=true" in message
    finally:
        db.dispose_engines()
        monkeypatch.setenv("PLAYRUN_DB_PGBOUNCER", "true")
        reset_settings()


def test_the_compose_images_entrypoint_pools_transactions(pg_url: str) -> None:
    """deploy/pgbouncer/entrypoint.sh (docker-compose's pgbouncer service) run with this
    machine's pgbouncer: clients log in with the password, and with one server connection
    a second client is served as soon as the first one's transaction ends, while both
    stay connected (session pooling would keep it waiting for the first to disconnect)."""
    with start_entrypoint(password="compose-secret") as port:
        url = f"postgresql://postgres:compose-secret@127.0.0.1:{port}/{PG_NAME}"
        with pytest.raises(psycopg.OperationalError, match="authentication failed"):
            psycopg.connect(url.replace("compose-secret", "wrong"), connect_timeout=5)
        with psycopg.connect(url, prepare_threshold=None) as first, \
                psycopg.connect(url, prepare_threshold=None, autocommit=True) as second:
            first.execute("SELECT 1")  # a transaction open: the one server connection
            answered = threading.Event()

            def query() -> None:
                second.execute("SELECT 2")
                answered.set()

            thread = threading.Thread(target=query)
            thread.start()
            assert not answered.wait(0.5)
            first.commit()
            assert answered.wait(10)
            thread.join()
