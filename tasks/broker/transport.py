"""kombu's Redis transport, with one command client per channel instead of one per call.

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
