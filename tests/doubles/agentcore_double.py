"""A loopback AgentCore Code Interpreter for the real boto3 client (rest-json + event stream).

moto has no code-interpreter sessions, so this serves the five operations the adapter
calls, with the service's own error answers: 429 ThrottlingException over the create
rate, 402 ServiceQuotaExceededException past the live-session quota, 403
AccessDeniedException, 404 ResourceNotFoundException for a stopped or expired session.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.doubles.agentcore_sessions import Session, new_session_id
from tests.doubles.agentcore_wire import (
    EVENT_STREAM,
    ApiError,
    access_denied,
    exception_event,
    invalid,
    iso,
    not_found,
    quota_exceeded,
    result_event,
    throttled,
)
from tests.doubles.base import PushBack

INTERPRETER = "aws.codeinterpreter.v1"
CREATE_TIMEOUT_S = 2.0  # the adapter's create timeout under this double (its env says so)
DEFAULT_SESSION_TIMEOUT_S = 900


class AgentCoreState:
    """Everything the server knows, behind one lock; tools run outside it."""

    def __init__(
        self,
        root: Path,
        *,
        creates_per_min: float | None,
        max_live: int | None,
        create_latency_s: float,
    ) -> None:
        self.root = root
        self.scratch = root / "_tasks"
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.creates_per_min = creates_per_min
        self.max_live = max_live
        self.create_latency_s = create_latency_s
        self.lock = threading.Lock()
        self.sessions: dict[str, Session] = {}
        self.tokens: dict[str, str] = {}
        self.recent: collections.deque[float] = collections.deque()
        self.pushbacks: collections.deque[tuple[PushBack, float | None]] = collections.deque()
        self.invoke_faults: collections.deque[ApiError] = collections.deque()
        self.answer_late = 0
        self.made = 0
        self.rejected = 0
        self.max_seen = 0
        self.page_size = 100  # tests lower it to see pages

    def live(self) -> list[Session]:
        return [s for s in self.sessions.values() if s.status == "READY"]

    # --- control plane -------------------------------------------------------------------

    def start(self, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """The new (or replayed) session's answer and how long to hold it."""
        name, token = body.get("name"), body.get("clientToken")
        timeout_s = body.get("sessionTimeoutSeconds", DEFAULT_SESSION_TIMEOUT_S)
        if not isinstance(name, str) or not 1 <= len(name) <= 100:
            raise invalid("name must be 1-100 characters")
        if not isinstance(token, str) or not 33 <= len(token) <= 256:
            raise invalid("clientToken must be 33-256 characters")
        if not isinstance(timeout_s, int) or not 1 <= timeout_s <= 28800:
            raise invalid("sessionTimeoutSeconds must be 1-28800")
        with self.lock:
            known = self.tokens.get(token)
            if known is not None:
                session = self.sessions[known]
                if (session.name, session.timeout_s) != (name, timeout_s):
                    raise invalid(
                        "The client token was used with other parameters",
                        "IdempotentParameterMismatchException",
                    )
                return self._started(session), 0.0
            if self.pushbacks:
                kind, retry_after_s = self.pushbacks.popleft()
                if kind == "rate_limited":
                    self.rejected += 1
                    raise throttled(retry_after_s)
                if kind == "capacity_unavailable":
                    raise quota_exceeded(self.max_live or 0, retry_after_s)
                raise access_denied()
            now = time.time()
            while self.recent and self.recent[0] <= now - 60.0:
                self.recent.popleft()
            if self.creates_per_min is not None and len(self.recent) >= self.creates_per_min:
                self.rejected += 1
                raise throttled(max(self.recent[0] + 60.0 - now, 0.001))
            if self.max_live is not None and len(self.live()) >= self.max_live:
                raise quota_exceeded(self.max_live)
            self.recent.append(now)
            session = Session(
                new_session_id(),
                name,
                token,
                timeout_s,
                now,
                self.root / "sessions" / secrets.token_hex(6),
            )
            session.workdir.mkdir(parents=True)
            self.sessions[session.session_id] = session
            self.tokens[token] = session.session_id
            self.made += 1
            self.max_seen = max(self.max_seen, len(self.live()))
            hold = self.create_latency_s
            if self.answer_late:
                self.answer_late -= 1
                hold += CREATE_TIMEOUT_S + 1.5
            return self._started(session), hold

    def _started(self, session: Session) -> dict[str, Any]:
        return {
            "codeInterpreterIdentifier": INTERPRETER,
            "sessionId": session.session_id,
            "createdAt": iso(session.created_at),
        }

    def session(self, session_id: str | None, *, ready: bool = True) -> Session:
        with self.lock:
            session = self.sessions.get(session_id or "")
        if session is None or (ready and session.status != "READY"):
            raise not_found(f"Session {session_id}")
        return session

    def stop(self, session_id: str | None) -> dict[str, Any]:
        session = self.session(session_id)
        self.terminate(session)
        return {
            "codeInterpreterIdentifier": INTERPRETER,
            "sessionId": session.session_id,
            "lastUpdatedAt": iso(session.updated_at),
        }

    def terminate(self, session: Session) -> None:
        with self.lock:
            if session.status != "READY":
                return
            session.status, session.updated_at = "TERMINATED", time.time()
        session.kill_all()
        shutil.rmtree(session.workdir, ignore_errors=True)

    def list(self, body: dict[str, Any]) -> dict[str, Any]:
        status, token = body.get("status"), body.get("nextToken")
        size = min(int(body.get("maxResults") or 20), self.page_size)
        try:
            offset = int(base64.b64decode(token).decode()) if token else 0
        except ValueError:
            raise invalid("nextToken is not valid") from None
        with self.lock:
            found = sorted(
                (s for s in self.sessions.values() if status is None or s.status == status),
                key=lambda s: s.created_at,
                reverse=True,
            )
        page = found[offset : offset + size]
        doc: dict[str, Any] = {"items": [s.summary(INTERPRETER) for s in page]}
        if offset + size < len(found):
            doc["nextToken"] = base64.b64encode(str(offset + size).encode()).decode()
        return doc

    def get(self, session_id: str | None) -> dict[str, Any]:
        session = self.session(session_id, ready=False)
        doc = session.summary(INTERPRETER)
        doc.pop("lastUpdatedAt")
        return {**doc, "sessionTimeoutSeconds": session.timeout_s}

    def expire(self) -> None:
        now = time.time()
        with self.lock:
            due = [s for s in self.live() if s.expires_at <= now]
        for session in due:
            self.terminate(session)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: AgentCoreState  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        try:
            body = json.loads(raw) if raw else {}
            if len(parts) < 4 or parts[0] != "code-interpreters":
                raise ApiError(404, "UnknownOperationException", f"no route {url.path}")
            if parts[1] != INTERPRETER:
                raise not_found(f"Code interpreter {parts[1]}")
            route = (method, parts[2], parts[3])
            if route == ("POST", "tools", "invoke"):
                self._invoke(body)
                return
            hold = 0.0
            if route == ("PUT", "sessions", "start"):
                doc, hold = self.state.start(body)
            elif route == ("PUT", "sessions", "stop"):
                doc = self.state.stop(query.get("sessionId"))
            elif route == ("POST", "sessions", "list"):
                doc = self.state.list(body)
            elif route == ("GET", "sessions", "get"):
                doc = self.state.get(query.get("sessionId"))
            else:
                raise ApiError(404, "UnknownOperationException", f"no route {url.path}")
        except ApiError as exc:
            self._answer(exc.status, exc.body(), {"x-amzn-ErrorType": exc.code, **exc.headers})
            return
        if hold:
            time.sleep(hold)
        self._answer(200, json.dumps(doc).encode(), {})

    def _invoke(self, body: dict[str, Any]) -> None:
        session_id = self.headers.get("x-amzn-code-interpreter-session-id")
        session = self.state.session(session_id)
        name, args = body.get("name"), body.get("arguments") or {}
        with self.state.lock:
            fault = self.state.invoke_faults.popleft() if self.state.invoke_faults else None
        if fault is not None:
            frame = exception_event(fault)
        else:
            frame = result_event(session.invoke(str(name), args, self.state.scratch))
        self._answer(
            200,
            frame,
            {"x-amzn-code-interpreter-session-id": session.session_id},
            content_type=EVENT_STREAM,
        )

    def _answer(
        self,
        status: int,
        payload: bytes,
        headers: dict[str, str],
        *,
        content_type: str = "application/json",
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("x-amzn-RequestId", secrets.token_hex(16))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            self.close_connection = True  # the client gave up (an answer after its timeout)


class AgentCoreDouble:
    name = "agentcore"
    pushback = True

    def __init__(self, state: AgentCoreState, url: str) -> None:
        self.state = state
        self.url = url
        self.env = {
            "AWS_ENDPOINT_URL_BEDROCK_AGENTCORE": url,
            "AWS_ACCESS_KEY_ID": "AKIDPLAYRUNDOUBLE",
            "AWS_SECRET_ACCESS_KEY": "playrun-double-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
            "PLAYRUN_AGENTCORE_CREATE_TIMEOUT_S": f"{CREATE_TIMEOUT_S:g}",
        }

    def provider(self, root: Path) -> Any:
        from tasks.sandbox.providers.agentcore import AgentCoreProvider

        return AgentCoreProvider(root)

    def push_back(
        self, kind: PushBack, *, retry_after_s: float | None = None, times: int = 1
    ) -> None:
        with self.state.lock:
            self.state.pushbacks.extend([(kind, retry_after_s)] * times)

    def fail_invoke(self, error: ApiError, *, times: int = 1) -> None:
        """The next tool calls answer 200, then an exception inside the event stream."""
        with self.state.lock:
            self.state.invoke_faults.extend([error] * times)

    def create_after_timeout(self) -> None:
        with self.state.lock:
            self.state.answer_late += 1

    def kill_runner(self, sandbox_id: str) -> None:
        self.state.session(sandbox_id).kill_all()

    def live_count(self) -> int:
        with self.state.lock:
            return len(self.state.live())

    def max_live_seen(self) -> int:
        return self.state.max_seen

    def creates(self) -> int:
        return self.state.made

    def rejected_429(self) -> int:
        return self.state.rejected

    def sandboxes(self) -> list[str]:
        with self.state.lock:
            return [s.session_id for s in self.state.live()]


@contextmanager
def running(
    tmp_path: Path,
    *,
    creates_per_min: float | None = None,
    max_live: int | None = None,
    create_latency_s: float = 0.0,
) -> Iterator[AgentCoreDouble]:
    state = AgentCoreState(
        tmp_path / "agentcore",
        creates_per_min=creates_per_min,
        max_live=max_live,
        create_latency_s=create_latency_s,
    )
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    done = threading.Event()

    def reap() -> None:  # sessionTimeoutSeconds is a hard lifetime
        while not done.wait(0.1):
            state.expire()

    reaper = threading.Thread(target=reap, daemon=True)
    reaper.start()
    double = AgentCoreDouble(state, f"http://127.0.0.1:{server.server_address[1]}")
    saved = {key: os.environ.get(key) for key in double.env}
    os.environ.update(double.env)  # boto3 reads its endpoint and credentials from here
    try:
        yield double
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        done.set()
        reaper.join()
        server.shutdown()
        server.server_close()
        for session in list(state.sessions.values()):
            state.terminate(session)
