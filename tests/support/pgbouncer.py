"""A real PgBouncer in transaction pooling mode in front of the session's PostgreSQL.

Debian's `pgbouncer` (.ci/run installs it) listens on a free loopback port with its
config, auth file and Unix socket in a temporary directory, and stops with the fixture.
PgBouncer refuses to run as root: as root it is started with `-u` as an unprivileged user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from tasks.host.processes import die_with_parent, free_port

BINARIES = ("pgbouncer", "/usr/sbin/pgbouncer")
START_TIMEOUT_S = 20.0
# Few server connections: every process's transactions take turns on the same ones, so a
# statement that assumed its own session would meet another's state.
SERVER_POOL = 5


def binary() -> str | None:
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _user_to_run_as() -> str | None:
    """None when not root; else the first unprivileged account that exists."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("pgbouncer refuses root, and there is no postgres or nobody user")


def _upstream(pg_base: str) -> tuple[str, int, str]:
    """Host (or Unix socket directory), port and user of the session's PostgreSQL."""
    url = make_url(pg_base)
    host = url.host or str(url.query.get("host") or "127.0.0.1")
    return host, url.port or 5432, url.username or "postgres"


class PgBouncer:
    """One pgbouncer process; `url(database)` is a SQLAlchemy URL through it."""

    def __init__(self, pg_base: str) -> None:
        found = binary()
        if found is None:
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
        host, upstream_port, self.user = _upstream(pg_base)
        self.dir = Path(tempfile.mkdtemp(prefix="playrun-test-pgbouncer-"))
        self.port = free_port()
        self.log = self.dir / "pgbouncer.log"
        (self.dir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(f"""[databases]
* = host={host} port={upstream_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir = {self.dir}
auth_type = trust
auth_file = {self.dir / "userlist.txt"}
admin_users = {self.user}
pool_mode = transaction
default_pool_size = {SERVER_POOL}
max_client_conn = 1000
idle_transaction_timeout = 20
""")
        argv = [found]
        run_as = _user_to_run_as()
        if run_as is not None:
            shutil.chown(self.dir, run_as)
            argv += ["-u", run_as]
        self._log_file = self.log.open("wb")
        self.proc = subprocess.Popen([*argv, str(ini)], stdout=self._log_file,
                                     stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        self._wait_accepting()

    def _wait_accepting(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("pgbouncer did not accept connections") from None
                time.sleep(0.05)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def show(self, what: str) -> list[dict[str, Any]]:
        """A `SHOW` of PgBouncer's admin console (CLIENTS, SERVERS, POOLS, ...)."""
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(f"postgresql://{self.user}@127.0.0.1:{self.port}/pgbouncer",
                             autocommit=True, prepare_threshold=None,
                             row_factory=dict_row) as conn:
            return list(conn.execute(f"SHOW {what}").fetchall())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def running(pg_base: str) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(pg_base)
    try:
        yield bouncer
    finally:
        bouncer.stop()



ENTRYPOINT = Path(__file__).resolve().parents[2] / "deploy" / "pgbouncer" / "entrypoint.sh"


@contextmanager
def start_entrypoint(*, password: str) -> Iterator[int]:
    """docker-compose's pgbouncer entrypoint, run here in front of the session's PostgreSQL
    with one server connection; yields its port."""
    from tests.support.session import PG_BASE

    directory = Path(tempfile.mkdtemp(prefix="playrun-test-pgbouncer-compose-"))
    host, upstream_port, user = _upstream(PG_BASE)
    port = free_port()
    run_as = _user_to_run_as()
    if run_as is not None:
        shutil.chown(directory, run_as)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PGBOUNCER_DIR": str(directory),
           "PGBOUNCER_UPSTREAM_HOST": host, "PGBOUNCER_UPSTREAM_PORT": str(upstream_port),
           "PGBOUNCER_USER": user, "PGBOUNCER_PASSWORD": password,
           "PGBOUNCER_LISTEN_ADDR": "127.0.0.1", "PGBOUNCER_PORT": str(port),
           "PGBOUNCER_POOL_SIZE": "1"}
    log = (directory / "entrypoint.log").open("wb")
    proc = subprocess.Popen(["sh", str(ENTRYPOINT)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, user=run_as, cwd=directory,
                            preexec_fn=die_with_parent)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the entrypoint's pgbouncer did not start: "
                                       f"{(directory / 'entrypoint.log').read_text()}") \
                        from None
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
