"""Helpers for the runtime sheet tests: launched attempts of a sheet play, direct gateway
calls, an in-process play context for the sheet client, and a proxy that loses answers."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import sqlalchemy as sa

from models import Outbox, Sheet, SheetRow, SheetWriteIntent, db_now
from tasks.admission.submit import admit
from tasks.execution import runner_client
from tasks.execution.launch import mark_launching
from tasks.security import tokens
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tasks.store.fence import Fence
from tests.support.paths import PLAYS
from tests.support.runs import must_claim

SHEET_PLAY = PLAYS / "sheet_enrich.py"
PLAY_NAME = "sheet_enrich"
ORG_PREFIX = "sht-"


def new_org() -> str:
    return f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}"


@dataclass
class Launched:
    fence: Fence
    launch_id: str
    org_id: str

    @property
    def run_id(self) -> str:
        return self.fence.run_id

    def token(self, caps: tuple[str, ...] = tokens.RUNNER_CAPABILITIES) -> str:
        return tokens.mint(org_id=self.org_id, run_id=self.fence.run_id,
                           generation=self.fence.generation, launch_id=self.launch_id,
                           capabilities=caps, ttl_s=300, secret=get_settings().secret_key)


def launch(org_id: str | None = None, play: Path = SHEET_PLAY) -> Launched:
    """A run of the sheet play, claimed and launched by hand (no worker, no sandbox)."""
    org = org_id or new_org()
    admitted = admit(play, {}, org, None)
    with session_scope() as session:
        session.execute(sa.update(Outbox).where(Outbox.id == admitted.outbox_id)
                        .values(sent_at=db_now()))
    fence = must_claim(admitted.run_id)
    launch_id = mark_launching(fence, get_settings())
    assert launch_id is not None
    return Launched(fence, launch_id, org)


def call(url: str, token: str, body: Any, *, raw: bytes | None = None,
         client: httpx.Client | None = None) -> httpx.Response:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    post = client.post if client is not None else httpx.post
    if raw is not None:
        return post(url + "/v1/runtime", content=raw, headers=headers, timeout=60)
    return post(url + "/v1/runtime", json=body, headers=headers, timeout=60)


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["result"]
    return result


def refused(response: httpx.Response, status: int, code: str) -> str:
    assert (response.status_code, response.json().get("code")) == (status, code), response.text
    error: str = response.json()["error"]
    assert error
    return error


def page(*keys: str, **data: Any) -> list[dict[str, Any]]:
    return [{"key": k, "data": {"domain": k, **data}} for k in keys]


def start(url: str, run: Launched, rows: list[dict[str, Any]], *, table: str = "companies",
          version: int | None = None, action: str = "sheet_start_with_intent",
          client: httpx.Client | None = None) -> httpx.Response:
    body: dict[str, Any] = {"action": action, "table": table, "rows": rows}
    if version is not None:
        body["write_version"] = version
    return call(url, run.token(), body, client=client)


def write(url: str, run: Launched, version: int, rows: list[dict[str, Any]], *,
          table: str = "companies") -> httpx.Response:
    return call(url, run.token(), {"action": "sheet_write", "table": table,
                                   "write_version": version, "rows": rows})


def done(*keys: str) -> list[dict[str, Any]]:
    return [{"key": k, "status": "done", "result": {"k": k}} for k in keys]


def db_rows(org_id: str, table: str = "companies") -> dict[str, tuple[str, int, Any]]:
    """key -> (status, write_version, result), straight from the table."""
    with session_scope() as session:
        rows = session.execute(
            sa.select(SheetRow.key, SheetRow.status, SheetRow.write_version, SheetRow.result)
            .join(Sheet, Sheet.id == SheetRow.sheet_id)
            .where(Sheet.org_id == org_id, Sheet.play == PLAY_NAME, Sheet.name == table))
        return {r.key: (r.status, r.write_version, r.result) for r in rows}


def intents(run_id: str) -> list[tuple[int, str, str]]:
    """(version, kind, status) of every write intent a run holds."""
    with session_scope() as session:
        return [tuple(r) for r in session.execute(  # type: ignore[misc]
            sa.select(SheetWriteIntent.version, SheetWriteIntent.kind, SheetWriteIntent.status)
            .where(SheetWriteIntent.run_id == run_id).order_by(SheetWriteIntent.version))]


class Stopped(Exception):
    """The runner would have exited here (its uplink's on_stop)."""


@dataclass
class PlayCtx:
    """What the sheet client needs of a play's ctx, wired to a real gateway in-process."""

    run: Launched
    url: str
    socket_path: str | None = None
    halted: tuple[str, str] | None = None
    logs: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        gateway = runner_client.Gateway(self.url, self.socket_path)
        calls = self.calls

        class Counting:
            def call(self, token: str, body: dict[str, Any]) -> Any:
                calls.append({"action": body["action"], "rows": len(body.get("rows") or []),
                              "bytes": len(json.dumps(body))})
                return gateway.call(token, body)

        def stop(why: str) -> None:
            raise Stopped(why)

        self._uplink = SimpleNamespace(gateway=Counting(), token=self.run.token(),
                                       on_stop=stop)
        self.run_id = self.run.run_id

    def log(self, message: str, **fields: Any) -> None:
        self.logs.append((time.monotonic(), message, fields))

    def actions(self, name: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["action"] == name]


class LossyProxy:
    """An HTTP proxy in front of the gateway that, for the first `drop` requests naming
    `action`, waits for the gateway's whole answer (so the server has committed) and then
    closes the connection without passing it on: a response lost on the way back."""

    def __init__(self, upstream: str, action: str, drop: int = 1) -> None:
        self.upstream = upstream
        self.action = action
        self.left = drop
        self.seen: list[tuple[str, bool]] = []  # (action, dropped)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._client = httpx.Client(timeout=60)
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        self._client.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_request(conn: socket.socket) -> tuple[dict[str, str], bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError("client went away")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        headers = {}
        for line in head.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError("client went away")
            body += chunk
        return headers, body

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                headers, body = self._read_request(conn)
            except (ConnectionError, OSError):
                return
            answer = self._client.post(self.upstream + "/v1/runtime", content=body, headers={
                "authorization": headers.get("authorization", ""),
                "content-type": "application/json"})
            try:
                action = str(json.loads(body).get("action"))
            except (ValueError, AttributeError):
                action = "?"
            with self._lock:
                drop = action == self.action and self.left > 0
                if drop:
                    self.left -= 1
                self.seen.append((action, drop))
            if drop:
                return  # the gateway answered (and committed); the caller never hears it
            conn.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n"
                         % (answer.status_code, len(answer.content)) + answer.content)
