"""Runner calls on a real gateway: an attempt launched by hand (no worker), its token,
and one runtime request."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

import tasks
from tasks.execution.launch import mark_launching
from tasks.security import tokens
from tasks.settings import get_settings
from tasks.store.fence import Fence
from tests.support.runs import must_claim, new_run

if TYPE_CHECKING:  # the stack module starts the session's servers when imported
    from tests.support.stack import Gateway


@dataclass
class Launched:
    fence: Fence
    launch_id: str
    org_id: str

    def token(
        self,
        caps: tuple[str, ...] = tokens.RUNNER_CAPABILITIES,
        *,
        ttl_s: float = 60,
        generation: int | None = None,
        run_id: str | None = None,
        secret: str | None = None,
    ) -> str:
        return tokens.mint(
            org_id=self.org_id,
            run_id=run_id or self.fence.run_id,
            generation=generation or self.fence.generation,
            launch_id=self.launch_id,
            capabilities=caps,
            ttl_s=ttl_s,
            secret=secret or get_settings().secret_key,
        )


def launched() -> Launched:
    run_id = new_run()
    fence = must_claim(run_id)
    launch_id = mark_launching(fence, get_settings())
    assert launch_id is not None
    return Launched(fence, launch_id, tasks.get_run(run_id).org_id)


def call(gw: Gateway, token: str, body: Any, *, raw: bytes | None = None) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if raw is not None:
        return httpx.post(gw.url + "/v1/runtime", content=raw, headers=headers, timeout=30)
    return httpx.post(gw.url + "/v1/runtime", json=body, headers=headers, timeout=30)


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert (response.status_code, response.json()["code"]) == (status, code), response.text
    assert response.json()["error"]


def _socket_inode(local_port: int, remote_port: int) -> str | None:
    """The inode of the TCP socket local_port -> remote_port (/proc/net/tcp, hex ports)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)) == (
                local_port, remote_port):
            return fields[9]
    return None


def server_pid(server_port: int, client_port: int, pids: Iterable[int]) -> int | None:
    """Which of `pids` holds the server end of the open connection from `client_port`."""
    inode = _socket_inode(server_port, client_port)
    for pid in pids:
        try:
            links = {os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()}
        except OSError:
            continue
        if f"socket:[{inode}]" in links:
            return pid
    return None
