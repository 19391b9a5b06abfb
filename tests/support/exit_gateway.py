"""A stand-in gateway for exit reports: raw HTTP on a Unix socket or loopback TCP, each
request recorded, answered with `status` (None: never answered, the connection held)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any


class StubGateway:
    def __init__(self, path: Path | None = None, status: int | None = 200,
                 on_request: Callable[[], Any] | None = None) -> None:
        """On `path` (a Unix socket) or, without one, on a free TCP port (`url`).
        `on_request`: called as each request arrives; what it returns is kept in `seen`."""
        self.path, self.status, self.on_request = path, status, on_request
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.seen: list[Any] = []
        self.stopped = threading.Event()
        if path is not None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(str(path))
            self.url = ""
        else:
            self.sock = socket.create_server(("127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (line.partition(":") for line in lines[1:])}
            headers[":request-line"] = lines[0]
            while len(body) < int(headers.get("content-length", "0")):
                body += conn.recv(4096)
            if self.on_request is not None:
                self.seen.append(self.on_request())
            self.requests.append((headers, body))
            if self.status is None:
                self.stopped.wait(30)  # holds the connection open, answering nothing
                return
            conn.sendall(f"HTTP/1.1 {self.status} X\r\nContent-Length: 2\r\n"
                         "Connection: close\r\n\r\n{}".encode())

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()


# A command that looks for tokens meant for others: it writes to seen.txt (a JSON list)
# its environment, every environ and command line in /proc and every file under its
# directory, leaves a result.json linked to /etc/passwd, and exits 5 without settling.
PROBE = """
import json, os
seen = [json.dumps(dict(os.environ))]
for pid in os.listdir('/proc'):
    for name in ('environ', 'cmdline'):
        try:
            seen.append(open(f'/proc/{pid}/{name}', 'rb').read().decode('latin-1'))
        except OSError:
            pass
for top, _, names in os.walk('.'):
    for name in names:
        try:
            seen.append(open(os.path.join(top, name), 'rb').read().decode('latin-1'))
        except OSError:
            pass
open('seen.txt', 'w').write(json.dumps(seen))
os.symlink('/etc/passwd', 'result.json')
os._exit(5)
"""
