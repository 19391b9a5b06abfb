"""Best-effort Redis notifications: a settled run wakes its waiters at once.

Waiters also poll SQL with backoff, so a lost notification only costs latency.
"""

from __future__ import annotations

import logging
import os

import redis

from tasks.constants import KEY_RUN_DONE
from tasks.settings import get_settings
from tasks.store import redisconn

log = logging.getLogger("playrun.notify")
_clients: dict[tuple[int, str], redis.Redis] = {}


def redis_client(url: str | None = None) -> redis.Redis:
    """One client per process and URL (forked children make their own)."""
    url = url or get_settings().redis_url
    key = (os.getpid(), url)
    client = _clients.get(key)
    if client is None:
        client = redisconn.client(url, socket_timeout=5, socket_connect_timeout=2,
                                  socket_keepalive=True, health_check_interval=30)
        _clients[key] = client
    return client


def run_settled(run_id: str, status: str) -> None:
    try:
        redis_client().publish(KEY_RUN_DONE + run_id, status)
    except redis.RedisError as exc:
        log.info("could not notify waiters of run %s: %s", run_id, exc)
