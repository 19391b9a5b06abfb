"""Every Redis client playrun makes, from one URL (docs/operations.md, "Redis").

Three forms of URL:

- ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS): one server.
- ``redis+sentinel://[user:password@]host:port[,host:port...]/service/db``: the primary
  Redis Sentinel names for ``service``, found again after a failover. The password is
  the primary's; the sentinels are asked without one.
- ``redis+cluster://[user:password@]host:port[,host:port...]``: a Redis Cluster, for the
  start-rate buckets only (PLAYRUN_START_RATE_REDIS_URL): kombu has no Cluster transport,
  so the broker, the result backend and playrun's other keys stay on one primary.

This module is the only place that turns such a URL into a client: redis-py's for
playrun's own keys (`client`, `async_client`), Celery's settings for its broker and
result backend (`celery_settings`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any
from urllib.parse import quote

import redis
import redis.asyncio as aredis
import redis.asyncio.sentinel as asentinel
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel, SentinelConnectionPool

from tasks.constants import SENTINEL_FOLLOW_S
from tasks.errors import ConfigurationError
from tasks.parse.redisurl import Target, parse, redact

__all__ = ["Target", "async_client", "celery_settings", "client", "parse", "point_celery",
           "redact"]

# kombu's transports with playrun's changes (one command client; pools that follow).
_TRANSPORT = "tasks.broker.transport:Transport"


class FollowingPool(SentinelConnectionPool):
    """A Sentinel pool that asks for the primary at most every SENTINEL_FOLLOW_S while in
    use: after a planned failover the old primary takes writes until the sentinels
    reconfigure it (about 10 s), so a pool that only asks on connect keeps writing there.
    A changed answer drops the idle connections; busy ones are dropped as they return."""

    _asked_at = float("-inf")

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if now - self._asked_at >= SENTINEL_FOLLOW_S:
            self._asked_at = now
            with contextlib.suppress(redis.RedisError):  # no answer: the command will say
                self.proxy.get_master_address()  # type: ignore[no-untyped-call]
        return super().get_connection(*args, **kwargs)


def following(pool: SentinelConnectionPool, **overrides: Any) -> FollowingPool:
    """A FollowingPool on the same service, sentinels and connection options (`overrides`
    replace some), for pools made elsewhere (kombu's) or copied (the limiter's)."""
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
    kwargs.update(overrides)
    return FollowingPool(  # type: ignore[no-untyped-call]
        pool.service_name, pool.sentinel_manager, is_master=pool.is_master,
                         check_connection=pool.check_connection,
                         connection_class=pool.connection_class,
                         max_connections=pool.max_connections, **kwargs)


class AsyncFollowingPool(asentinel.SentinelConnectionPool):
    """FollowingPool for asyncio (the gateway)."""

    _asked_at = float("-inf")

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if now - self._asked_at >= SENTINEL_FOLLOW_S:
            self._asked_at = now
            with contextlib.suppress(redis.RedisError):
                await self.get_master_address()  # type: ignore[no-untyped-call]
        return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]


def _sentinel_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """The sentinels are asked with the same socket bounds (never with the password)."""
    return {k: v for k, v in options.items()
            if k.startswith("socket_") or k == "health_check_interval"}


def client(url: str, **options: Any) -> redis.Redis:
    """A client on the server, or on the primary Sentinel names (found again after a
    failover). `options` are redis-py connection options (timeouts, retry)."""
    target = parse(url)
    if target.kind in ("redis", "other"):  # redis-py names what it cannot read
        return redis.Redis.from_url(url, **options)
    if target.kind == "cluster":
        raise ConfigurationError(
            "PLAYRUN_REDIS_URL cannot be a Redis Cluster (Celery's broker has no Cluster "
            "transport); put a cluster in PLAYRUN_START_RATE_REDIS_URL")
    manager = Sentinel(  # type: ignore[no-untyped-call]
        list(target.nodes), sentinel_kwargs=_sentinel_kwargs(options))
    found: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call]
        target.service, redis_class=redis.Redis, connection_pool_class=FollowingPool,
        db=target.db,
        **target.credentials, **options)
    return found


def script_client(url: str, **options: Any) -> redis.Redis | RedisCluster:
    """`client`, or a RedisCluster for a cluster URL (scripts whose keys share a slot)."""
    target = parse(url)
    if target.kind != "cluster":
        return client(url, **options)
    options = {k: v for k, v in options.items() if k != "health_check_interval"}
    nodes = [ClusterNode(h, p) for h, p in target.nodes]  # type: ignore[no-untyped-call]
    return RedisCluster(startup_nodes=nodes, **target.credentials, **options)


def async_client(url: str, **options: Any) -> aredis.Redis:
    """`client` for asyncio (the gateway)."""
    target = parse(url)
    if target.kind in ("redis", "other"):
        plain: aredis.Redis = aredis.Redis.from_url(url, **options)
        return plain
    if target.kind == "cluster":
        client(url)  # raises the same ConfigurationError
    manager = asentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(target.nodes), sentinel_kwargs=_sentinel_kwargs(options))
    found: aredis.Redis = manager.master_for(
        target.service, redis_class=aredis.Redis, connection_pool_class=AsyncFollowingPool,
        db=target.db,
        **target.credentials, **options)
    return found


def celery_settings(url: str) -> dict[str, Any]:
    """broker_url, result_backend and the transport options Celery needs for `url`.

    Sentinel becomes Celery's own form, ``sentinel://host:port/db;sentinel://...`` with
    the service as the ``master_name`` transport option of both the broker and the backend.
    """
    target = parse(url)
    if target.kind in ("redis", "other"):
        transport = _TRANSPORT if url.startswith(("redis://", "rediss://")) else None
        return {"broker_url": url, "result_backend": url, "transport_options": {},
                "transport": transport}
    if target.kind == "cluster":
        client(url)  # raises: no Cluster transport
    auth = ""
    if target.username or target.password:
        auth = f"{quote(target.username or '', safe='')}:{quote(target.password or '', safe='')}@"
    joined = ";".join(f"sentinel://{auth}{host}:{port}/{target.db}"
                      for host, port in target.nodes)
    return {"broker_url": joined, "result_backend": joined,
            "transport_options": {"master_name": target.service},
            "transport": _TRANSPORT.replace(":Transport", ":SentinelTransport")}


def point_celery(conf: Any, url: str) -> None:
    """Point an already configured Celery app (its `conf`) at `url`."""
    found = celery_settings(url)
    options = found["transport_options"]
    conf.update(broker_url=found["broker_url"], result_backend=found["result_backend"],
                broker_transport=found["transport"],
                playrun_redis_url=url,
                broker_transport_options={**(conf.broker_transport_options or {}), **options},
                result_backend_transport_options={
                    **(conf.result_backend_transport_options or {}), **options})
