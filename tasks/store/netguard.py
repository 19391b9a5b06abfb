"""Timeouts that turn a half-open connection into an error instead of a hang.

A failover, a NAT or firewall that forgets a connection, or a partition that outlasts
TCP's patience can leave a socket that never answers and is never reset. Without these,
a worker blocked on such a socket waits forever, and a PostgreSQL session whose client
vanished mid-transaction keeps its row locks until the server's own keepalive (2 h).
"""

from __future__ import annotations

from typing import Any

# Keepalive probes: first after a third of the timeout idle, then this many, evenly spaced.
_PROBES = 3


def pg_connect_args(timeout_s: float) -> dict[str, Any]:
    """libpq parameters: connect, keepalive and unacknowledged-send bounds of `timeout_s`,
    and a server-side end to a transaction left idle for twice that (its client is gone:
    nothing of playrun waits inside an open transaction)."""
    idle = max(1, int(timeout_s / 3))
    interval = max(1, int((timeout_s - idle) / _PROBES))
    return {
        "connect_timeout": max(2, round(min(timeout_s, 10))),  # libpq reads 1 as 2
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": _PROBES,
        "tcp_user_timeout": round(timeout_s * 1000),
        "options": f"-c idle_in_transaction_session_timeout={round(timeout_s * 2000)}",
    }


def redis_socket_options(timeout_s: float) -> dict[str, Any]:
    """redis-py / kombu connection options bounding every blocking read and connect."""
    return {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": min(timeout_s, 5.0),
        "socket_keepalive": True,
        # kombu also drops a BRPOP connection whose reply is overdue by this much.
        "health_check_interval": max(1, round(timeout_s / 2)),
    }


def celery_backend_options(timeout_s: float) -> dict[str, Any]:
    """The same bounds for Celery's Redis result backend (its own setting names)."""
    redis = redis_socket_options(timeout_s)
    return {
        "redis_socket_timeout": redis["socket_timeout"],
        "redis_socket_connect_timeout": redis["socket_connect_timeout"],
        "redis_socket_keepalive": True,
        "redis_backend_health_check_interval": redis["health_check_interval"],
    }
