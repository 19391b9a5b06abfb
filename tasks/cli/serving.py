"""Before a server starts: its address is free, or one coded line says who holds it."""

from __future__ import annotations

import errno
import socket

from tasks.errors import AddressInUseError


def check_free(host: str, port: int, what: str, setting: str) -> None:
    """Bind and release HOST:PORT as uvicorn will (SO_REUSEADDR), so a taken port is one
    coded line here instead of a traceback, or a `ready` line, from the server."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            shown = f"[{host}]" if ":" in host else host
            raise AddressInUseError(
                f"{what} cannot listen on {shown}:{port}: another process uses that port "
                f"(stop it, or choose another address with {setting})") from None
