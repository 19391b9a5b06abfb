"""Shared fixtures on this machine's real services.

At import (before `tasks` is imported, since Celery reads its broker then) the
session claims a private Redis db number and names a fresh PostgreSQL database;
the database is created and migrated with Alembic on first use, dropped at the end.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tasks.host.processes import pid_alive  # import tasks reads no setting
from tests.private_servers import admin_url, database_url, ensure

# The configured servers, or private ones from wheels when those do not answer.
PG_BASE, REDIS_BASE, PRIVATE_SERVERS = ensure(
    os.environ.get("PLAYRUN_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432"),
    os.environ.get("PLAYRUN_TEST_REDIS", "redis://127.0.0.1:6379"))
ROOT = Path(__file__).resolve().parent.parent
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
SANDBOX_ROOT = Path(tempfile.mkdtemp(prefix="playrun-test-sb-"))
GATEWAY_DIR = Path(tempfile.mkdtemp(prefix="playrun-test-gw-"))
METRICS_DIR = Path(tempfile.mkdtemp(prefix="playrun-test-metrics-"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


GATEWAY_PORT = free_port()

BASE_ENV = {
    "PLAYRUN_REDIS_URL": TEST_REDIS_URL,
    "PLAYRUN_DATABASE_URL": TEST_PG_URL,
    "PLAYRUN_SECRET_KEY": "test-secret-" + secrets.token_hex(16),
    "PLAYRUN_SANDBOX_ROOT": str(SANDBOX_ROOT),
    "PLAYRUN_LEASE_SECONDS": "20",
    "PLAYRUN_RUN_TIMEOUT_S": "60",
    "PLAYRUN_GC_GRACE_S": "0",
    "PLAYRUN_GATEWAY_URL": f"http://127.0.0.1:{GATEWAY_PORT}",
    "PLAYRUN_GATEWAY_SOCKET": str(GATEWAY_DIR / "sock" / "gateway.sock"),
    "PLAYRUN_HEARTBEAT_INTERVAL_S": "1",
    "PLAYRUN_HEARTBEAT_TIMEOUT_S": "4",
    "PLAYRUN_REAP_INTERVAL_S": "1",
    # Tests kill release paths on purpose and wait for the reaper to take them over.
    "PLAYRUN_RELEASE_GRACE_S": "2",
    # Metrics endpoints on free ports (URLs in METRICS_DIR): never the defaults other
    # sessions or a real deployment on this machine listen on.
    "PLAYRUN_METRICS_DIR": str(METRICS_DIR),
    "PLAYRUN_METRICS_WORKER_ADDR": "127.0.0.1:0",
    "PLAYRUN_METRICS_BEAT_ADDR": "127.0.0.1:0",
    "PLAYRUN_METRICS_GATEWAY_ADDR": "127.0.0.1:0",
}
os.environ.update(BASE_ENV)


def _psql(sql: str) -> None:
    import psycopg

    with psycopg.connect(admin_url(PG_BASE), autocommit=True) as c:
        c.execute(sql)


def _drop_orphaned_databases() -> None:
    """Databases of killed test sessions (their pid is gone) are dropped."""
    import psycopg

    with psycopg.connect(admin_url(PG_BASE), autocommit=True) as c:
        names = [r[0] for r in c.execute(
            "select datname from pg_database where datname like 'playrun_test_%'")]
    for name in names:
        parts = name.split("_")
        if len(parts) >= 3 and parts[2].isdigit() and not pid_alive(int(parts[2])):
            _psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pytest_sessionstart(session: pytest.Session) -> None:
    if PRIVATE_SERVERS:  # one line, -q or not
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(PRIVATE_SERVERS)


TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test is marked with its tier, the folder it lives in (`-m unit` and so on)."""
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        parts = item.path.resolve().relative_to(tests_dir).parts
        if parts and parts[0] in TIERS:
            item.add_marker(parts[0])


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    yield TEST_REDIS_URL


@pytest.fixture(scope="session", autouse=True)
def _session_cleanup() -> Iterator[None]:
    yield
    client = redis.Redis.from_url(TEST_REDIS_URL)
    client.flushdb()
    client.close()
    shutil.rmtree(SANDBOX_ROOT, ignore_errors=True)
    shutil.rmtree(GATEWAY_DIR, ignore_errors=True)
    shutil.rmtree(METRICS_DIR, ignore_errors=True)


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis[bytes]]:
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    yield client
    for key in client.scan_iter(match="*"):
        if key != SESSION_MARK.encode() and not key.startswith(b"_kombu") \
                and key not in (b"playrun", b"unacked", b"unacked_index"):
            client.delete(key)
    client.close()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for the session, migrated to head by Alembic."""
    _drop_orphaned_databases()
    _psql(f'CREATE DATABASE "{PG_NAME}"')
    from tasks.store import db

    db.upgrade(TEST_PG_URL)
    yield TEST_PG_URL
    db.dispose_engines()
    _psql(f'DROP DATABASE IF EXISTS "{PG_NAME}" WITH (FORCE)')


def die_with_parent() -> None:
    """In the child: a worker or gateway whose test session was killed goes with it, so it
    never consumes the next session's tasks."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@pytest.fixture
def sqlite_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A migrated SQLite database (the embedded default) that this test's code uses."""
    from tasks.settings import reset_settings
    from tasks.store import db

    url = f"sqlite:///{tmp_path / 'playrun.db'}"
    monkeypatch.setenv("PLAYRUN_DATABASE_URL", url)
    reset_settings()
    db.upgrade(url)
    yield url
    monkeypatch.undo()
    reset_settings()


def stop_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal a child's whole process group; SIGKILL it if it has not gone in 15 s."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, 9)
            proc.wait()


def worker_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYRUN_")}
    env.update(BASE_ENV)
    env.update(overrides)
    return env


class Worker:
    """A real `celery -A tasks worker` subprocess."""

    # With beat by default: quiet runners are found only by the reaper.
    def __init__(self, env: dict[str, str], *, concurrency: int = 2, beat: bool = True,
                 log_path: Path | None = None, name: str | None = None) -> None:
        self.name = name or f"w{secrets.token_hex(4)}@test"
        self.log_path = log_path or Path(tempfile.mktemp(prefix="playrun-worker-", suffix=".log"))
        args = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-n", self.name,
                f"--concurrency={concurrency}", "--loglevel=INFO", "--without-mingle",
                "--without-gossip"]
        if beat:
            args.append("--beat")
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, env=env, cwd=str(ROOT), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=die_with_parent)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.output()[-3000:]}")
            if b"ready." in self.log_path.read_bytes():
                return
            time.sleep(0.1)
        raise RuntimeError(f"worker not ready: {self.output()[-3000:]}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def child_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def stop(self, sig: int = 15) -> None:
        stop_group(self.proc, sig)
        self.log.close()


class Gateway:
    """A real `playrun gateway` subprocess (TCP and Unix socket)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.url = env["PLAYRUN_GATEWAY_URL"]
        self.log_path = Path(tempfile.mktemp(prefix="playrun-gateway-", suffix=".log"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "tasks.cli.main", "gateway"],
                                     env=self.env, cwd=str(ROOT), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=die_with_parent)
        self.wait_ready()

    def wait_ready(self, timeout: float = 30.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited: {self.output()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200 and \
                        b"ready" in self.log_path.read_bytes():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"gateway not ready: {self.output()[-3000:]}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = 15) -> None:
        if self.proc is not None:
            stop_group(self.proc, sig)
        self.log.close()


@pytest.fixture(scope="session")
def gateway(pg_url: str) -> Iterator[Gateway]:
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
    w = Worker(worker_env())
    w.wait_ready()
    yield w
    w.stop()


PLAYS = ROOT / "tests" / "plays"
