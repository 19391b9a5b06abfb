"""kombu's Redis transport, with one command client per channel instead of one per call;
and its Sentinel transport, with pools that follow the primary (SentinelTransport).

kombu builds a new `redis.Redis` for every ack, every unacked-index write and every
publish (its `conn_or_acquire`), and a client's constructor fills a fresh table of reply
parsers: about a fifth of a worker main process's CPU under load. A client is only a
handle on the channel's connection pool (thread-safe: each command takes a connection
from the pool), so one per pool does the same work. Messages and their envelopes are
kombu's own; the asynchronous client (BRPOP, the event loop) is left as kombu makes it.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

from tasks.store import redisconn


class Channel(kombu_redis.Channel):
    _command_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        pool = self.pool  # a new one after a fork or a lost connection: a new client then
        client = self._command_client
        if client is None or client.connection_pool is not pool:
            client = self._command_client = super()._create_client()  # type: ignore[no-untyped-call]
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(kombu_redis.SentinelChannel):
    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        # kombu's pool asks the sentinels only on connect: publishes would go on to the old
        # primary for ~10 s after a planned failover (tasks/store/redisconn.py).
        pool = super()._sentinel_managed_pool(asynchronous)  # type: ignore[no-untyped-call]
        return redisconn.following(pool)


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport, its pools following the primary."""

    Channel = SentinelChannel
