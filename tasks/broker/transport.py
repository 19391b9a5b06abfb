"""kombu's Redis transport, with one command client per channel instead of one per call;
and its Sentinel transport, with pools that follow the primary (SentinelTransport). Both
close as lost, not broken, when their server died under unacked messages.

kombu builds a new `redis.Redis` for every ack, every unacked-index write and every
publish (its `conn_or_acquire`), and a client's constructor fills a fresh table of reply
parsers: about a fifth of a worker main process's CPU under load. A client is only a
handle on the channel's connection pool (thread-safe: each command takes a connection
from the pool), so one per pool does the same work. Messages and their envelopes are
kombu's own; the asynchronous client (BRPOP, the event loop) is left as kombu makes it.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu import transport as kombu_transports
from kombu.transport import redis as kombu_redis

from tasks.store import redisconn


class _ClosedIsLost:
    """A channel whose connection was closed under it says so as a lost connection.

    When the broker goes away while messages are unacked (its primary killed), the
    consumer closes the connection, and closing the channel first gives those messages
    back, on a pool it builds from the connection's parameters, which are gone by then.
    kombu raises AttributeError there, which a worker takes for unrecoverable and exits;
    a connection error is ignored by the close, and the worker reconnects. The messages
    stay in the unacked index, where the visibility timeout restores them.
    """

    connection: Any

    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:
            raise redis.ConnectionError("the broker connection was closed")
        return super()._connparams(asynchronous)  # type: ignore[misc]


class Channel(_ClosedIsLost, kombu_redis.Channel):
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


class SentinelChannel(_ClosedIsLost, kombu_redis.SentinelChannel):
    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        # kombu's pool asks the sentinels only on connect: publishes would go on to the old
        # primary for ~10 s after a planned failover (tasks/store/redisconn.py).
        pool = super()._sentinel_managed_pool(asynchronous)  # type: ignore[no-untyped-call]
        return redisconn.following(pool)


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport, its pools following the primary."""

    Channel = SentinelChannel


# A lost connection makes kombu switch to the URL's next alternate (every sentinel is
# one), and a switch takes the transport from that URL's scheme: `sentinel` must still
# name this one, or the worker would go on after its first failover without it.
kombu_transports.TRANSPORT_ALIASES["sentinel"] = f"{__name__}:SentinelTransport"
