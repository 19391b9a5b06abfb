"""`playrun dashboard`: checks its settings, then serves the pages under uvicorn."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass

import uvicorn

from tasks.constants import DASHBOARD_MIN_TOKEN_CHARS
from tasks.dashboard.app import create_app
from tasks.dashboard.auth import Access
from tasks.errors import ConfigurationError
from tasks.settings import Settings
from tasks.store.db import require_current_schema


@dataclass(frozen=True)
class Plan:
    host: str
    port: int
    read_token: str
    write_token: str | None
    generated: bool  # no PLAYRUN_DASHBOARD_TOKEN (SQLite only): one made for this process


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(f"PLAYRUN_DASHBOARD_ADDR {text!r} is not HOST:PORT "
                                 f"(e.g. 127.0.0.1:8790)")
    return host, int(port)


def plan(settings: Settings) -> Plan:
    """Where to listen and with which tokens, or ConfigurationError saying what to fix."""
    settings.check()
    host, port = parse_addr(settings.dashboard_addr)
    if port == settings.gateway_listen_address()[1]:
        raise ConfigurationError(f"PLAYRUN_DASHBOARD_ADDR port {port} is the gateway's "
                                 "(PLAYRUN_GATEWAY_URL); the dashboard needs its own listener")
    read, write = settings.dashboard_token, settings.dashboard_write_token
    for name, token in (("PLAYRUN_DASHBOARD_TOKEN", read),
                        ("PLAYRUN_DASHBOARD_WRITE_TOKEN", write)):
        if token is not None and len(token.strip()) < DASHBOARD_MIN_TOKEN_CHARS:
            raise ConfigurationError(f"{name} is shorter than {DASHBOARD_MIN_TOKEN_CHARS} "
                                     "characters; use e.g. `openssl rand -hex 24`")
    if write is not None and write == read:
        raise ConfigurationError("PLAYRUN_DASHBOARD_WRITE_TOKEN must differ from "
                                 "PLAYRUN_DASHBOARD_TOKEN (the write token also reads)")
    generated = False
    if read is None:
        if settings.is_postgres:
            raise ConfigurationError("PLAYRUN_DASHBOARD_TOKEN is not set; the dashboard does "
                                     "not start against PostgreSQL without a token")
        read, generated = secrets.token_urlsafe(24), True
    return Plan(host, port, read.strip(), write.strip() if write else None, generated)


async def _serve(server: uvicorn.Server, banner: str) -> None:
    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.02)
        print(banner, flush=True)

    await asyncio.gather(server.serve(), announce())


def serve(settings: Settings) -> None:
    p = plan(settings)
    require_current_schema()
    app = create_app(settings, Access(p.read_token, p.write_token))
    server = uvicorn.Server(uvicorn.Config(app, host=p.host, port=p.port, log_level="warning",
                                           access_log=False, lifespan="off",
                                           timeout_graceful_shutdown=5))
    banner = f"playrun dashboard ready on http://{p.host}:{p.port}" + (
        f" (token for this process: {p.read_token})" if p.generated else "")
    asyncio.run(_serve(server, banner))
