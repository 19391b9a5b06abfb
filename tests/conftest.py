"""Fixtures shared by the three tiers; their helpers live in tests/support.

Unit tests need no server: PostgreSQL and Redis are set up (tests.support.session) only
when the tests asked for reach outside tests/unit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.env import GATEWAY_DIR, LOCAL_ENV, METRICS_DIR, SANDBOX_ROOT

if TYPE_CHECKING:
    import redis

    from tasks.broker.publish import StubPublisher
    from tasks.sandbox.fake import FakeScript
    from tests.support.pgbouncer import PgBouncer
    from tests.support.stack import Gateway, Worker

os.environ.update(LOCAL_ENV)
TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e")
SESSION_MODULE = "tests.support.session"


def _tier(path: Path) -> str | None:
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def _needs_servers(args: list[str], rootdir: Path) -> bool:
    """Whether the tests asked for may reach outside tests/unit (no argument: all tests)."""
    paths = [rootdir / arg.split("::")[0] for arg in args if not arg.startswith("-")]
    return not paths or any(_tier(path) != "unit" for path in paths)


def pytest_configure(config: pytest.Config) -> None:
    """Servers before the session starts: pytest's fixture scan of the Celery plugin loads
    the app's configuration, broker URL included, at session start."""
    if _needs_servers(list(config.args), config.invocation_params.dir):
        import tests.support.session  # noqa: F401


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> None:
    """Servers for a module that may need them, however it was named on the command line."""
    if file_path.suffix == ".py" and _tier(file_path) in ("integration", "e2e"):
        import tests.support.session  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test is marked with its tier, the folder it lives in (`-m unit` and so on)."""
    for item in items:
        tier = _tier(item.path)
        if tier is not None:
            item.add_marker(tier)


def pytest_collection_finish(session: pytest.Session) -> None:
    started = getattr(sys.modules.get(SESSION_MODULE), "PRIVATE_SERVERS", None)
    if started:  # one line, -q or not
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(started)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    from tests.support.session import TEST_REDIS_URL

    yield TEST_REDIS_URL


@pytest.fixture(scope="session", autouse=True)
def _session_cleanup() -> Iterator[None]:
    yield
    session = sys.modules.get(SESSION_MODULE)
    if session is not None:
        import redis

        client = redis.Redis.from_url(session.TEST_REDIS_URL)
        client.flushdb()
        client.close()
    shutil.rmtree(SANDBOX_ROOT, ignore_errors=True)
    shutil.rmtree(GATEWAY_DIR, ignore_errors=True)
    shutil.rmtree(METRICS_DIR, ignore_errors=True)


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis[bytes]]:
    import redis

    from tests.support.session import SESSION_MARK

    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    yield client
    for key in client.scan_iter(match="*"):
        if (
            key != SESSION_MARK.encode()
            and not key.startswith(b"_kombu")
            and key not in (b"playrun", b"unacked", b"unacked_index")
        ):
            client.delete(key)
    client.close()


@pytest.fixture(scope="session")
def rabbitmq_vhost() -> Iterator[str]:
    """A vhost of this session's own on this machine's RabbitMQ (deleted after): parallel
    sessions never share a queue."""
    from tasks.testing import rabbitmq

    reason = rabbitmq.unavailable()
    if reason is not None:
        pytest.skip(reason)
    rabbitmq.drop_orphaned_vhosts()
    vhost = rabbitmq.create_vhost()
    yield vhost
    rabbitmq.ctl("delete_vhost", vhost)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for the session, migrated to head by Alembic."""
    from tasks.store import db
    from tests.support.session import PG_NAME, TEST_PG_URL, drop_orphaned_databases, psql

    drop_orphaned_databases()
    psql(f'CREATE DATABASE "{PG_NAME}"')
    db.upgrade(TEST_PG_URL)
    yield TEST_PG_URL
    db.dispose_engines()
    psql(f'DROP DATABASE IF EXISTS "{PG_NAME}" WITH (FORCE)')


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite file migrated by Alembic, copied for each test that asks for one."""
    import sqlite3

    from tasks.store import db

    path = tmp_path_factory.mktemp("sqlite-template") / "playrun.db"
    db.upgrade(f"sqlite:///{path}")
    with contextlib.closing(sqlite3.connect(path)) as conn:  # everything into the main file
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


@pytest.fixture
def sqlite_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              _sqlite_template: Path) -> Iterator[str]:
    """A migrated SQLite database (the embedded default) that this test's code uses."""
    from tasks.settings import reset_settings

    path = tmp_path / "playrun.db"
    shutil.copyfile(_sqlite_template, path)
    url = f"sqlite:///{path}"
    monkeypatch.setenv("PLAYRUN_DATABASE_URL", url)
    reset_settings()
    yield url
    monkeypatch.undo()
    reset_settings()


@pytest.fixture
def fifo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Starts published at admission (PLAYRUN_START_ORDER=fifo): no fair relay, no Redis."""
    from tasks.settings import reset_settings

    monkeypatch.setenv("PLAYRUN_START_ORDER", "fifo")
    reset_settings()
    yield
    reset_settings()


@pytest.fixture
def published() -> Iterator[StubPublisher]:
    """Task messages this test's code sends, recorded instead of reaching a broker."""
    from tasks.broker.publish import stubbed

    with stubbed() as stub:
        yield stub


@pytest.fixture
def fake_stack(sqlite_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
               ) -> Iterator[FakeScript]:
    """SQLite, the `fake` provider (runners handed to a host that is not running: no
    process starts) and the in-memory limiter; yields the fault script."""
    from tasks.acquisition import permits, starthistory
    from tasks.sandbox.fake import FakeScript
    from tasks.settings import reset_settings
    from tests.support.units import FakeLimiter

    root = tmp_path / "sandboxes"
    monkeypatch.setenv("PLAYRUN_SANDBOX_PROVIDER", "fake")
    monkeypatch.setenv("PLAYRUN_SANDBOX_ROOT", str(root))
    reset_settings()
    limiter = FakeLimiter()
    monkeypatch.setattr(permits, "limiter", lambda: limiter)
    monkeypatch.setattr(starthistory, "record_permit", lambda *a, **k: None)
    monkeypatch.setattr(starthistory, "record_penalty", lambda *a, **k: None)
    script = FakeScript(root)
    script.set(hosted_runners=True)
    yield script
    reset_settings()


@pytest.fixture(scope="session")
def gateway(pg_url: str) -> Iterator[Gateway]:
    from tests.support.stack import Gateway, worker_env

    g = Gateway(worker_env())
    yield g
    g.stop()


@pytest.fixture(autouse=True)
def _gateway_with_the_database(request: pytest.FixtureRequest) -> None:
    """Every test on the session database has the session gateway: runners push to it."""
    if "pg_url" in request.fixturenames:
        request.getfixturevalue("gateway")


@pytest.fixture(scope="module")
def worker(pg_url: str, gateway: Gateway) -> Iterator[Worker]:
    from tests.support.stack import Worker, worker_env

    w = Worker(worker_env())
    w.wait_ready()
    yield w
    w.stop()


@pytest.fixture(scope="module")
def pgbouncer(pg_url: str) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling mode in front of the session's migrated database
    (tests/support/pgbouncer.py); stopped after the module."""
    from tests.support.pgbouncer import binary, running
    from tests.support.session import PG_BASE

    if binary() is None:
        pytest.skip("pgbouncer is not installed (.ci/run installs it)")
    with running(PG_BASE) as bouncer:
        yield bouncer
