"""The runner's own HTTP/1.1 client (stdlib sockets): keep-alive, a gateway that closed
an idle connection, and answers that are not the gateway's."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from tasks.execution.runner_client import Gateway, Refused, Unavailable
from tasks.execution.runner_http import tcp_address


def answer(status: int, doc: object, *, close: bool = False) -> bytes:
    body = json.dumps(doc).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n" \
           f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "")
    return head.encode() + b"\r\n" + body


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int([line.split(b":")[1] for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length")][0])
    while len(body) < length:
        body += conn.recv(65536)
    return body


class Server:
    """A TCP server that hands each accepted connection to `serve`."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self.serve = serve
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            self.serve(conn)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        server.sock.close()


def test_calls_share_one_kept_alive_connection(servers: list[Server]) -> None:
    def serve(conn: socket.socket) -> None:
        while (body := read_request(conn)):
            conn.sendall(answer(200, {"ok": True, "result": json.loads(body)}))

    servers.append(server := Server(serve))
    gw = Gateway(server.url, None)
    assert [gw.call("t", {"n": i}) for i in range(5)] == [{"n": i} for i in range(5)]
    assert server.accepted == 1


def test_an_idle_connection_the_gateway_closed_is_replaced_once(servers: list[Server]) -> None:
    def serve(conn: socket.socket) -> None:  # one answer per connection, then close
        if read_request(conn):
            conn.sendall(answer(200, {"ok": True, "result": "hi"}))

    servers.append(server := Server(serve))
    gw = Gateway(server.url, None)
    assert gw.call("t", {}) == "hi"
    assert gw.call("t", {}) == "hi"  # the kept connection was closed: a fresh one
    assert server.accepted == 2


def test_refusals_and_answers_that_are_not_the_gateways(servers: list[Server]) -> None:
    replies = iter([answer(409, {"code": "FENCE_LOST", "error": "no"}),
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                    b"garbage\r\n\r\n",
                    answer(503, {"code": "GATEWAY_UNAVAILABLE", "error": "db"})])

    def serve(conn: socket.socket) -> None:
        while read_request(conn):
            conn.sendall(next(replies))

    servers.append(server := Server(serve))
    gw = Gateway(server.url, None)
    with pytest.raises(Refused) as refused:
        gw.call("t", {})
    assert refused.value.code == "FENCE_LOST" and refused.value.status == 409
    for _ in range(3):
        with pytest.raises(Unavailable):
            gw.call("t", {})


def test_nothing_listening_is_unavailable() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(Unavailable):
        Gateway(f"http://127.0.0.1:{port}", None).call("t", {})


@pytest.mark.parametrize(("url", "address"), [
    ("http://127.0.0.1:8765", ("127.0.0.1", 8765, False, "")),
    ("http://gateway:9000/v1", ("gateway", 9000, False, "/v1")),
    ("http://[::1]:8765", ("::1", 8765, False, "")),
    ("http://example", ("example", 80, False, "")),
    ("https://gw.example.com", ("gw.example.com", 443, True, "")),
    ("https://gw.example.com:8443/playrun/", ("gw.example.com", 8443, True, "/playrun")),
])
def test_gateway_urls_are_read_without_urllib(url: str,
                                              address: tuple[str, int, bool, str]) -> None:
    assert tcp_address(url) == address
