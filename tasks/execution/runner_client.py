"""The runner's line to the gateway: heartbeats, progress delivery, the terminal push.

Standard library only; copied into each sandbox as playrun_client.py beside runner.py.
It speaks HTTP over the gateway's Unix socket when the sandbox has one (strict
sandboxes have no network), else over TCP. Nothing here decides an outcome: the
result file is written first, so a gateway that never answers loses nothing.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the host imports the runner's files as tasks.execution.*
    from tasks import protocol
    from tasks.execution.runner_http import Connection, Stale, tcp_address
    from tasks.execution.runner_http import Unavailable as Unavailable  # re-exported
else:  # in the sandbox they are flat files beside runner.py
    import playrun_protocol as protocol
    from playrun_http import Connection, Stale, Unavailable, tcp_address

REQUEST_TIMEOUT_S = 10.0
BATCH = 500
# Events held in memory while the gateway is away; beyond this they are counted, not kept.
BUFFER_LIMIT = 20_000
DELIVER_EVERY_S = 0.2
# How long one call waits out 429s before it reports the gateway unavailable.
MAX_RATE_WAIT_S = 60.0
# call_until's backoff while the gateway is unavailable: first and longest pause (seconds).
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 2.0


class Refused(Exception):
    """The gateway answered with a refusal (a JSON code)."""

    def __init__(self, status: int, code: str, error: str) -> None:
        super().__init__(f"{code}: {error}")
        self.status, self.code, self.error = status, code, error


class Gateway:
    """One kept-alive connection per thread (heartbeat, delivery, the play's own calls)."""

    def __init__(self, url: str, socket_path: str | None) -> None:
        host, port, self.tls, self.prefix = tcp_address(url)
        self.address = (host, port)
        self.host_header = host if port in (80, 443) else f"{host}:{port}"
        self.socket_path = socket_path
        self._local = threading.local()

    def _connect(self) -> Connection:
        if self.socket_path and os.path.exists(self.socket_path):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(REQUEST_TIMEOUT_S)
            try:
                sock.connect(self.socket_path)
            except OSError:
                sock.close()
                raise
            return Connection(sock)
        sock = socket.create_connection(self.address, timeout=REQUEST_TIMEOUT_S)
        if self.tls:  # a remote sandbox crosses networks: the gateway proves who it is
            import ssl  # only remote runners pay for the import

            try:
                sock = ssl.create_default_context().wrap_socket(
                    sock, server_hostname=self.address[0])
            except OSError:  # ssl.SSLError is one
                sock.close()
                raise
        return Connection(sock, self.host_header)

    def _exchange(self, data: bytes, token: str, action: str = "") -> tuple[int, bytes]:
        conn: Connection | None = getattr(self._local, "conn", None)
        reused = conn is not None
        while True:
            try:
                if conn is None:
                    conn = self._connect()
                status, raw, closing = conn.post(self.prefix + protocol.GATEWAY_PATH, data, token,
                                                 action)
            except (Stale, OSError) as exc:
                if conn is not None:
                    conn.close()
                self._local.conn = conn = None
                # Idle keep-alive closed by the gateway: the request never reached it.
                if reused and isinstance(exc, (Stale, BrokenPipeError, ConnectionResetError)):
                    reused = False
                    continue
                raise Unavailable(str(exc)) from None
            except Unavailable:
                conn.close()  # type: ignore[union-attr]
                self._local.conn = None
                raise
            if closing:
                conn.close()
                conn = None
            self._local.conn = conn
            return status, raw

    def call(self, token: str, body: dict[str, Any]) -> Any:
        data = json.dumps(body, allow_nan=False).encode()
        action = body.get("action")
        waited = 0.0
        while True:
            status, raw = self._exchange(data, token, action if isinstance(action, str) else "")
            try:
                doc = json.loads(raw)
            except ValueError:
                raise Unavailable(f"HTTP {status} without JSON") from None
            if status != 429 or not isinstance(doc, dict) or waited >= MAX_RATE_WAIT_S:
                break
            # Past this attempt's rate: wait as told and send the same request again, so
            # the caller keeps its place (a delivery's order, a step's claim).
            pause = doc.get("retry_after_s")
            pause = min(float(pause), 5.0) if isinstance(pause, int | float) and pause > 0 \
                else 0.5
            time.sleep(pause)
            waited += pause
        if status == 429:
            raise Unavailable("the gateway kept this runner past its rate")
        if status == 200 and isinstance(doc, dict):
            return doc.get("result")
        if status >= 500 or not isinstance(doc, dict):
            raise Unavailable(f"HTTP {status}")
        raise Refused(status, str(doc.get("code")), str(doc.get("error")))


def jitter() -> float:
    """0.5 to 1.5, without importing random (its import costs more than this needs)."""
    return 0.5 + int.from_bytes(os.urandom(2), "big") / 65535


class Uplink:
    """Heartbeat and progress threads of one runner, and its final push."""

    def __init__(
        self,
        gateway: Gateway,
        token: str,
        projection_token: str,
        launch_id: str,
        interval_s: float,
        on_stop: Callable[[str], None],
    ) -> None:
        self.gateway = gateway
        self.token = token
        self.projection_token = projection_token
        self.launch_id = launch_id
        self.interval_s = max(interval_s, 0.2)
        self.on_stop = on_stop
        self._events: collections.deque[dict[str, Any]] = collections.deque()
        self._dropped = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._done = threading.Event()
        self._batch: dict[str, Any] | None = None
        self._sending = threading.Lock()  # one delivery at a time: batches stay in order
        self._full = False  # the gateway's progress budget is spent: count, do not send
        # Runtime sheet page and write-chunk sizes (rows), as the worker's settings say.
        self.sheet_rows: tuple[str, str] = ("", "")

    @classmethod
    def from_env(cls, on_stop: Callable[[str], None]) -> Uplink | None:
        # Taken out of the environment before the play starts: it needs none of them.
        env = {
            name: os.environ.pop(name, "")
            for name in (
                "PLAYRUN_TOKEN",
                "PLAYRUN_PROJECTION_TOKEN",
                "PLAYRUN_GATEWAY_URL",
                "PLAYRUN_GATEWAY_SOCKET",
                "PLAYRUN_LAUNCH_ID",
                "PLAYRUN_HEARTBEAT_S",
                "PLAYRUN_SHEET_PAGE_ROWS",
                "PLAYRUN_SHEET_WRITE_ROWS",
            )
        }
        token, projection = env["PLAYRUN_TOKEN"], env["PLAYRUN_PROJECTION_TOKEN"]
        url = env["PLAYRUN_GATEWAY_URL"]
        if not (token and projection and url):
            return None  # run by hand or by an old launcher: the result file is the channel
        gateway = Gateway(url, env["PLAYRUN_GATEWAY_SOCKET"] or None)
        try:
            interval = float(env["PLAYRUN_HEARTBEAT_S"] or 5)
        except ValueError:
            interval = 5.0
        uplink = cls(
            gateway, token, projection, env["PLAYRUN_LAUNCH_ID"] or "launch", interval, on_stop
        )
        uplink.sheet_rows = (env["PLAYRUN_SHEET_PAGE_ROWS"], env["PLAYRUN_SHEET_WRITE_ROWS"])
        return uplink

    def start(self) -> None:
        for target, name in (
            (self._beat, "playrun-heartbeat"),
            (self._deliver_loop, "playrun-progress"),
        ):
            threading.Thread(target=target, name=name, daemon=True).start()

    # --- heartbeats --------------------------------------------------------------------

    def _beat(self) -> None:
        # The launch granted a whole lease: a play shorter than one interval never beats.
        while not self._done.wait(self.interval_s):
            try:
                answer = self.gateway.call(self.token, {"action": protocol.ACTION_HEARTBEAT})
                if isinstance(answer, dict) and answer.get("cancel"):
                    self.on_stop("the run was cancelled")
            except Refused as exc:
                if exc.code in protocol.STOP_CODES:
                    self.on_stop(f"the gateway refused this runner: {exc}")
            except Unavailable:
                pass  # the reaper judges silence; a short outage costs nothing

    # --- progress ------------------------------------------------------------------------

    def add(self, event: dict[str, Any]) -> None:
        with self._lock:
            if self._full or len(self._events) >= BUFFER_LIMIT:
                self._dropped += 1
                return
            self._events.append(event)
            if len(self._events) >= BATCH:
                self._wake.set()

    def _next_batch(self) -> dict[str, Any] | None:
        with self._lock:
            if self._batch is None and (self._events or self._dropped):
                events = [self._events.popleft() for _ in range(min(BATCH, len(self._events)))]
                first = events[0]["seq"] if events else "x"
                last = events[-1]["seq"] if events else "x"
                self._batch = {
                    "action": protocol.ACTION_APPEND_EVENTS,
                    "idempotency_key": f"{self.launch_id}:{first}-{last}:{self._dropped}",
                    "delivery_lease_owner": f"runner:{self.launch_id}",
                    "events": events,
                    "dropped": self._dropped,
                }
                self._dropped = 0
            return self._batch

    def _deliver_once(self) -> bool:
        """Send the pending batch; True when nothing is left to send."""
        with self._sending:
            return self._send_pending()

    def _send_pending(self) -> bool:
        batch = self._next_batch()
        if batch is None:
            return True
        try:
            answer = self.gateway.call(self.projection_token, batch)
            if isinstance(answer, dict) and answer.get("full"):
                with self._lock:
                    self._full = True
                    self._dropped += len(self._events)
                    self._events.clear()
        except Refused as exc:
            if exc.code in protocol.STOP_CODES:
                self.on_stop(f"the gateway refused progress: {exc}")
            # Any other refusal of this batch would repeat forever: give it up, counted.
        with self._lock:
            self._batch = None
            return not self._events and not self._dropped

    def _deliver_loop(self) -> None:
        while not self._done.is_set():
            self._wake.wait(DELIVER_EVERY_S)
            self._wake.clear()
            try:
                while not self._deliver_once():
                    pass
            except Unavailable:
                self._done.wait(1.0)

    def flush(self, deadline: float) -> None:
        pause = 0.1
        while time.monotonic() < deadline:
            try:
                if self._deliver_once():
                    return
            except Unavailable:
                time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
                pause = min(pause * 2, 2.0)
        # Out of time: what is left is at least counted, never lost unsaid.
        with self._lock:
            self._dropped += len(self._events)
            self._events.clear()
        with contextlib.suppress(Unavailable, Refused), self._sending:
            self._send_pending()

    # --- the terminal --------------------------------------------------------------------

    def complete(self, result: dict[str, Any], deadline: float) -> bool:
        """Push the terminal, retrying with backoff until the deadline; True if answered."""
        pause = 0.1
        while True:
            try:
                self.gateway.call(
                    self.token, {"action": protocol.ACTION_COMPLETE, "result": result}
                )
                return True
            except Refused:
                return True  # FENCE_LOST: a terminal is settled (maybe this very push)
            except Unavailable:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                time.sleep(min(pause * jitter(), left))
                pause = min(pause * 2, 5.0)

    def stop(self) -> None:
        self._done.set()
        self._wake.set()


def call_until(uplink: Any, body: dict[str, Any], deadline: float) -> Any:
    """One action with the uplink's runner token (the play's steps and sheets), retried
    with backoff while the gateway is unavailable until `deadline` (time.monotonic()), then
    Unavailable. A refusal is raised; one that ends this runner's ownership stops it first."""
    pause = RETRY_FIRST_S
    while True:
        try:
            return uplink.gateway.call(uplink.token, body)
        except Refused as exc:
            if exc.code in protocol.STOP_CODES:
                uplink.on_stop(f"the gateway refused {body.get('action')}: {exc}")
            raise
        except Unavailable:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            time.sleep(min(pause * jitter(), left))
            pause = min(pause * 2, RETRY_MAX_S)
