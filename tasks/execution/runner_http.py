"""The runner's HTTP/1.1 to the gateway: one kept-alive connection, Content-Length bodies.

Standard library only; copied into each sandbox as playrun_http.py beside runner.py.
"""

from __future__ import annotations

import contextlib
import socket


class Unavailable(Exception):
    """The gateway could not be reached, or answered that it cannot serve now."""


class Stale(Exception):
    """A kept-alive connection the gateway closed while it was idle."""


# The gateway's answers are small JSON documents; anything bigger is not the gateway.
MAX_HEAD_BYTES = 64 * 1024
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class Connection:
    """HTTP/1.1 with keep-alive, just as much as the gateway speaks (Content-Length
    bodies). Not http.client: it imports the email package, a third of a runner's
    start-up."""

    def __init__(self, sock: socket.socket, host: str = "gateway") -> None:
        self.sock = sock
        self.host = host
        self.buffer = b""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise Stale("the gateway closed the connection")
        self.buffer += chunk

    def post(self, path: str, data: bytes, token: str,
             action: str = "") -> tuple[int, bytes, bool]:
        """(status, body, whether the gateway will close the connection)."""
        # Naming the action lets the gateway bound the body before reading it.
        named = f"X-Playrun-Action: {action}\r\n" if action else ""
        self.sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {token}\r\n"
            f"{named}Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            .encode("latin-1") + data)
        received = False
        while b"\r\n\r\n" not in self.buffer:
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise Unavailable("the answer's head is too large")
            try:
                self._fill()
            except Stale:
                if received:
                    raise Unavailable("the gateway closed the connection mid-answer") from None
                raise
            received = True
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise Unavailable(f"not an HTTP answer: {lines[0][:80]!r}")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length", "")
        if not length.isdigit() or int(length) > MAX_ANSWER_BYTES:
            raise Unavailable("the answer has no usable Content-Length")
        self.buffer = rest
        while len(self.buffer) < int(length):
            try:
                self._fill()
            except Stale:
                raise Unavailable("the gateway closed the connection mid-answer") from None
        body, self.buffer = self.buffer[: int(length)], self.buffer[int(length) :]
        closing = headers.get("connection", "").lower() == "close"
        return int(parts[1]), body, closing


def tcp_address(url: str) -> tuple[str, int, bool, str]:
    """host, port, TLS and path prefix of an http(s):// URL (urllib.parse is another import
    the runner avoids)."""
    scheme, _, rest = url.partition("://")
    tls = scheme.lower() == "https"
    authority, slash, prefix = rest.partition("/")
    authority = authority.rsplit("@", 1)[-1]
    if authority.startswith("["):
        host, _, port = authority[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = authority.partition(":")
    default = 443 if tls else 80
    return (host or "127.0.0.1", int(port) if port.isdigit() else default, tls,
            ("/" + prefix.strip("/")) if slash and prefix.strip("/") else "")
