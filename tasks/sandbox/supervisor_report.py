"""The supervisor's exit report: the gateway hears at once that the runner's process ended.

Standard library only: copied beside supervisor.py into each control record, with the
protocol as playrun_protocol.py; a cloud sandbox gets it at create as playrun_report.py,
for its boot script (tasks/sandbox/providers/bootstrap.py). The exec config's `report`
carries a token that may do nothing but report this launch's exit; it is never in the
command's environment. The report goes after the exit record is written, so the inspection
it starts finds the runner ended. It is bounded (a gateway down or slow costs a few
seconds, then it is given up: the heartbeat timeout still notices the exit) and it never
raises.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING or __package__:  # imported by the worker as tasks.sandbox.*
    from tasks import protocol
else:  # run beside supervisor.py in the control record
    import playrun_protocol as protocol

TRY_TIMEOUT_S = 2.0  # one connect, send and answer
TRIES = 3
BUDGET_S = 5.0  # all tries together
RETRY_PAUSE_S = 0.2
MAX_HEAD_BYTES = 16 * 1024


def document(exit_code: int, result_present: bool) -> dict[str, Any]:
    """The `exited` action; a negative exit code is the signal that ended the runner."""
    killed = exit_code < 0
    return {
        "action": protocol.ACTION_EXITED,
        "status": None if killed else min(exit_code, 255),
        "signal": -exit_code if killed else None,
        "result_present": result_present,
    }


def has_result(sandbox: Path) -> bool:
    """Whether the sandbox holds a result document, of any kind (the link is not followed)."""
    try:
        os.lstat(sandbox / protocol.RESULT_FILE)
    except OSError:
        return False
    return True


def _connect(report: dict[str, Any], timeout_s: float) -> tuple[socket.socket, str, str]:
    """(socket, Host header, path prefix): the Unix socket when there is one, else TCP."""
    path = str(report.get("socket") or "")
    if path and os.path.exists(path):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        return sock, "gateway", ""
    url = urlsplit(str(report.get("url") or ""))
    tls = url.scheme == "https"
    host = url.hostname or "127.0.0.1"
    port = url.port or (443 if tls else 80)
    sock = socket.create_connection((host, port), timeout=timeout_s)
    if tls:
        import ssl

        try:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        except OSError:
            sock.close()
            raise
    return sock, url.netloc or host, url.path.rstrip("/")


def post(report: dict[str, Any], body: bytes, timeout_s: float) -> int:
    """One POST; the HTTP status of the answer. OSError when the gateway is unreachable."""
    sock, host, prefix = _connect(report, timeout_s)
    with sock:
        sock.sendall(
            f"POST {prefix}{protocol.GATEWAY_PATH} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {report.get('token') or ''}\r\n"
            f"X-Playrun-Action: {protocol.ACTION_EXITED}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            .encode("latin-1") + body)
        head = b""
        while b"\r\n" not in head and len(head) < MAX_HEAD_BYTES:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise OSError("the gateway's answer is not HTTP")
    return int(parts[1])


def report_exit(report: dict[str, Any], exit_code: int, result_present: bool) -> bool:
    """Tell the gateway; True once it took the report. Retries what may pass (unreachable,
    rate limited, 5xx) within BUDGET_S; a refusal is final."""
    body = json.dumps(document(exit_code, result_present)).encode()
    deadline = time.monotonic() + BUDGET_S
    why = ""
    for _ in range(TRIES):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            status = post(report, body, min(TRY_TIMEOUT_S, left))
        except (OSError, ValueError) as exc:  # timeouts and TLS errors are OSErrors too
            why = f"{type(exc).__name__}: {exc}"
        else:
            if status == 200:
                return True
            why = f"HTTP {status}"
            if 400 <= status < 500 and status != 429:
                break
        time.sleep(max(0.0, min(RETRY_PAUSE_S, deadline - time.monotonic())))
    print(f"supervisor: the exit report was not delivered ({why[:200]}); the heartbeat "
          "timeout will notice the exit", file=sys.stderr, flush=True)
    return False
