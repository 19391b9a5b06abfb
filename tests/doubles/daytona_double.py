"""A loopback Daytona: the control-plane REST API under /api and the toolbox under /toolbox.

The real `daytona` SDK talks to it (DAYTONA_API_URL, DAYTONA_API_KEY); the sandbox DTO's
toolboxProxyUrl points the SDK's toolbox client back here. The SDK's socket.io event
stream is not served: the adapter polls, as the SDK does when events are off.
"""

from __future__ import annotations

import json
import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tasks.sandbox.providers.daytona import DaytonaProvider
from tests.doubles.base import PushBack
from tests.doubles.daytona_sandboxes import Box, Fleet, dto

API_KEY = "dtn_double_key"
BOUNDARY = "DAYTONA-FILE-BOUNDARY"
HOLD_MAX_S = 120.0  # a lost answer is held until the client hangs up, at most this long


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without TCP_NODELAY, each answer on a
    # keep-alive connection waits ~40 ms for the client's delayed ACK.
    disable_nagle_algorithm = True
    server: DaytonaServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- plumbing ----------------------------------------------------------------------

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _json(self) -> dict[str, Any]:
        raw = self._body()
        doc = json.loads(raw) if raw else {}
        return doc if isinstance(doc, dict) else {}

    def _send(
        self,
        status: int,
        doc: Any,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, error: str, **extra: str) -> None:
        self._send(status, {"statusCode": status, "message": message, "error": error, **extra})

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {API_KEY}":
            return True
        self._error(401, "Invalid credentials", "Unauthorized")
        return False

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        self.query = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = [p for p in url.path.split("/") if p]
        if not self._authorized():
            return
        fleet = self.server.fleet
        if parts[:2] == ["api", "sandbox"]:
            self._control(method, parts[2:], fleet)
        elif parts[:1] == ["toolbox"] and len(parts) >= 3:
            with fleet.lock:
                box = fleet.find(parts[1])
            if box is None or box.state() != "started":
                self._error(404, f"Sandbox {parts[1]} not found", "Not Found")
                return
            self._toolbox(method, "/".join(parts[2:]), box, fleet)
        else:
            self._error(404, f"Cannot {method} {url.path}", "Not Found")

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    # -- control plane -----------------------------------------------------------------

    def _control(self, method: str, rest: list[str], fleet: Fleet) -> None:
        base = self.server.base_url
        if not rest and method == "POST":
            self._create(self._json(), fleet)
        elif not rest and method == "GET":
            self._list(fleet)
        elif len(rest) == 2 and rest[1] == "toolbox-proxy-url":
            self._send(200, {"url": f"{base}/toolbox"})
        elif len(rest) == 1 and method in ("GET", "DELETE"):
            with fleet.lock:
                box = fleet.find(rest[0])
                if box is not None and method == "DELETE":
                    fleet.destroy(box)
            if box is None:
                self._error(404, f"Sandbox with ID or name {rest[0]} not found", "Not Found")
                return
            doc = dto(box, base_url=base)
            if method == "DELETE":
                doc["state"] = "destroying"
            self._send(200, doc)
        else:
            self._error(404, "Cannot route", "Not Found")

    def _create(self, body: dict[str, Any], fleet: Fleet) -> None:
        name = body.get("name")
        box: Box | None = None
        lose = False
        with fleet.lock:
            fleet.requests.append(body)
            now = time.time()
            refused = fleet.admit(now)
            if refused is not None:
                fleet.refusing += 1
            elif not (name and fleet.find(name) is not None):
                box = fleet.make(body, now)
                lose = fleet.lose_next > 0
                fleet.lose_next -= int(lose)
        if refused is not None:
            # A provider that takes its time to say no (outside the lock: others go on).
            self.server.stopping.wait(fleet.refusal_latency_s)
            with fleet.lock:
                fleet.refusing -= 1
            self._send(*refused)
        elif box is None:
            self._error(409, f"Sandbox with name {name} already exists", "Conflict")
        elif lose:
            self._hold_until_hangup()
        else:
            self._send(200, dto(box, base_url=self.server.base_url))

    def _hold_until_hangup(self) -> None:
        """The sandbox is made; its answer never reaches a client that stopped waiting."""
        deadline = time.monotonic() + HOLD_MAX_S
        while time.monotonic() < deadline and not self.server.stopping.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.1)
            if readable and not self.connection.recv(1, 2):  # 2: MSG_PEEK; b"": hung up
                break
        self.close_connection = True

    def _list(self, fleet: Fleet) -> None:
        wanted = json.loads(self.query.get("labels") or "{}")
        limit = int(self.query.get("limit") or 100)
        start = int(self.query.get("cursor") or 0)
        with fleet.lock:
            boxes = sorted(fleet.boxes.values(), key=lambda b: b.created)
        found = [b for b in boxes if all(b.labels.get(k) == v for k, v in wanted.items())]
        page = found[start : start + limit]
        more = start + limit < len(found)
        self._send(
            200,
            {
                "items": [dto(b, full=False, base_url=self.server.base_url) for b in page],
                "nextCursor": str(start + limit) if more else None,
            },
        )

    # -- toolbox -----------------------------------------------------------------------

    def _toolbox(self, method: str, route: str, box: Box, fleet: Fleet) -> None:
        if route == "process/execute" and method == "POST":
            try:
                self._send(200, fleet.execute(box, self._json()))
            except TimeoutError as exc:
                self._error(408, str(exc), "Request Timeout")
        elif route == "files/bulk-upload" and method == "POST":
            self._upload(box)
        elif route == "files/info" and method == "GET":
            self._info(box, self.query.get("path", ""))
        elif route == "files/bulk-download" and method == "POST":
            self._download(box, self._json().get("paths") or [])
        else:
            self._error(404, f"Cannot {method} /{route}", "Not Found")

    def _upload(self, box: Box) -> None:
        head = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
        form = BytesParser(policy=HTTP).parsebytes(head + self._body())
        paths: dict[str, str] = {}
        data: dict[str, bytes] = {}
        for part in form.iter_parts():
            name = str(part.get_param("name", header="content-disposition") or "")
            payload = part.get_payload(decode=True)
            content = payload if isinstance(payload, bytes) else b""
            index = name.removeprefix("files[").split("]")[0]
            if name.endswith(".path"):
                paths[index] = content.decode().strip()
            elif name.endswith(".file"):
                data[index] = content
        written = []
        for index, dest in paths.items():
            target = box.local(dest)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data.get(index, b""))
            written.append({"path": dest, "bytes": len(data.get(index, b""))})
        self._send(200, {"files": written})

    def _info(self, box: Box, path: str) -> None:
        target = box.local(path)
        if not target.exists():
            self._error(
                404,
                f"stat {path}: no such file or directory",
                "Not Found",
                code="FILE_NOT_FOUND",
                source="DAYTONA_DAEMON",
            )
            return
        stat = target.stat()
        modified = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stat.st_mtime))
        self._send(
            200,
            {
                "name": target.name,
                "path": path,
                "isDir": target.is_dir(),
                "size": stat.st_size,
                "mode": "-rw-r--r--",
                "modTime": modified,
                "modifiedAt": modified,
                "owner": "1000",
                "group": "1000",
                "permissions": "0644",
            },
        )

    def _download(self, box: Box, paths: list[str]) -> None:
        chunks: list[bytes] = []
        for path in paths:
            target = box.local(path)
            if target.is_file():
                head = (
                    f'Content-Disposition: form-data; name="file"; filename="{path}"\r\n'
                    "Content-Type: application/octet-stream\r\n"
                )
                content = target.read_bytes()
            else:
                head = (
                    f'Content-Disposition: form-data; name="error"; filename="{path}"\r\n'
                    "Content-Type: application/json\r\n"
                )
                content = json.dumps(
                    {
                        "message": f"file not found: {path}",
                        "statusCode": 404,
                        "code": "FILE_NOT_FOUND",
                    }
                ).encode()
            chunks.append(f"--{BOUNDARY}\r\n{head}\r\n".encode() + content + b"\r\n")
        chunks.append(f"--{BOUNDARY}--\r\n".encode())
        self._send(200, b"".join(chunks), content_type=f"multipart/form-data; boundary={BOUNDARY}")


class DaytonaServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.fleet = fleet
        self.stopping = threading.Event()
        self.base_url = f"http://127.0.0.1:{self.server_address[1]}"


class DaytonaDouble:
    name = "daytona"
    pushback = True

    def __init__(self, server: DaytonaServer) -> None:
        self.server = server
        self.fleet = server.fleet
        self.env = {"DAYTONA_API_URL": f"{server.base_url}/api", "DAYTONA_API_KEY": API_KEY}

    def provider(self, root: Path) -> DaytonaProvider:
        return DaytonaTestProvider(root, env=self.env)

    def push_back(
        self, kind: PushBack, *, retry_after_s: float | None = None, times: int = 1
    ) -> None:
        with self.fleet.lock:
            self.fleet.pushbacks.extend([(kind, retry_after_s)] * times)

    def create_after_timeout(self) -> None:
        with self.fleet.lock:
            self.fleet.lose_next += 1

    def kill_runner(self, sandbox_id: str) -> None:
        with self.fleet.lock:
            box = self.fleet.find(sandbox_id)
        if box is not None:
            self.fleet.kill_runner(box)

    def live_count(self) -> int:
        with self.fleet.lock:
            return len(self.fleet.boxes)

    def max_live_seen(self) -> int:
        return self.fleet.max_seen

    def creates(self) -> int:
        return self.fleet.created

    def rejected_429(self) -> int:
        return self.fleet.rejected

    def slow(self, *, create_s: float, refusal_s: float) -> None:
        """From now on: a made sandbox starts after create_s, a refusal answers after
        refusal_s."""
        with self.fleet.lock:
            self.fleet.create_latency_s = create_s
            self.fleet.refusal_latency_s = refusal_s

    def creating(self) -> int:
        """Sandboxes made but not started yet (their create call is still waiting)."""
        with self.fleet.lock:
            return sum(1 for box in self.fleet.boxes.values() if box.state() == "creating")

    def refusing(self) -> int:
        """Refused creates whose answer is still being held."""
        with self.fleet.lock:
            return self.fleet.refusing

    def sandboxes(self) -> list[str]:
        with self.fleet.lock:
            return list(self.fleet.boxes)

    def created_with(self, name: str) -> dict[str, Any]:
        """The create body the API got for this sandbox name (what the SDK sent)."""
        with self.fleet.lock:
            return next(b for b in reversed(self.fleet.requests) if b.get("name") == name)

    def local_path(self, sandbox_id: str, path: str) -> Path:
        box = self.fleet.boxes[sandbox_id]
        return box.local(str(PurePosixPath(path)))


class DaytonaTestProvider(DaytonaProvider):
    """The real adapter, pointed at the double without touching this process's env."""

    create_timeout_s = 3.0  # a lost create answer shows within seconds, not a minute

    def __init__(self, root: Path, *, env: dict[str, str]) -> None:
        super().__init__(root)
        self._double_env = env

    def _config(self) -> dict[str, Any]:
        return {
            "api_url": self._double_env["DAYTONA_API_URL"],
            "api_key": self._double_env["DAYTONA_API_KEY"],
        }


@contextmanager
def running(
    tmp_path: Path,
    *,
    creates_per_min: float | None = None,
    max_live: int | None = None,
    create_latency_s: float = 0.0,
) -> Iterator[DaytonaDouble]:
    fleet = Fleet(
        tmp_path / "daytona-sandboxes",
        creates_per_min=creates_per_min,
        max_live=max_live,
        create_latency_s=create_latency_s,
    )
    server = DaytonaServer(fleet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield DaytonaDouble(server)
    finally:
        server.stopping.set()
        with fleet.lock:
            for box in list(fleet.boxes.values()):
                fleet.destroy(box)
        server.shutdown()
        server.server_close()
