"""Redis URLs as playrun reads them: one server, a Sentinel service or a Cluster
(tasks/store/redisconn.py builds the clients; settings check the URLs here, before any
client exists). Standard library only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

from tasks.errors import ConfigurationError

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
_PLAIN = ("redis", "rediss", "unix")
DEFAULT_PORT = 6379
SENTINEL_PORT = 26379
Kind = Literal["redis", "sentinel", "cluster", "other"]


@dataclass(frozen=True)
class Target:
    """A parsed Redis URL."""

    kind: Kind
    url: str
    nodes: tuple[tuple[str, int], ...] = ()  # sentinels, or a cluster's seed nodes
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None

    @property
    def credentials(self) -> dict[str, Any]:
        out = {"username": self.username, "password": self.password}
        return {k: v for k, v in out.items() if v is not None}


def _nodes(netloc: str, default_port: int, url: str) -> tuple[tuple[str, int], ...]:
    nodes = []
    for part in netloc.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep:
            host, port = part.strip(), str(default_port)
        host = host.removeprefix("[").removesuffix("]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(f"Redis URL {redact(url)!r}: {part!r} is not host:port")
        nodes.append((host, int(port)))
    return tuple(nodes)


def parse(url: str) -> Target:
    """The target of a Redis URL, or a ConfigurationError naming what is wrong."""
    scheme = url.partition("://")[0].lower()
    if scheme in _PLAIN:
        return Target("redis", url)
    if scheme == "sentinel":
        raise ConfigurationError(
            "Redis URL: write Sentinel as redis+sentinel://host:port[,host:port]/service/db "
            "(playrun translates it for Celery)")
    if scheme not in (SENTINEL_SCHEME, CLUSTER_SCHEME):
        return Target("other", url)  # another broker for Celery; no client of playrun's
    # urlsplit refuses a comma list in the port; split the credentials off by hand.
    rest = url.split("://", 1)[1]
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if scheme == CLUSTER_SCHEME:
        if parts:
            raise ConfigurationError(
                f"Redis URL {redact(url)!r}: a cluster has no database number or service")
        return Target("cluster", url, _nodes(hosts, DEFAULT_PORT, url),
                      username=username, password=password)
    if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ConfigurationError(
            f"Redis URL {redact(url)!r}: expected redis+sentinel://host:port[,host:port]"
            "/service/db")
    return Target("sentinel", url, _nodes(hosts, SENTINEL_PORT, url), parts[0],
                  int(parts[1]) if len(parts) == 2 else 0, username, password)


def redact(url: str) -> str:
    """The URL without its password."""
    head, sep, rest = url.partition("://")
    userinfo, at, tail = rest.partition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{head}{sep}{userinfo.partition(':')[0]}:***@{tail}"
