"""Private Redis topologies on loopback from the redis-server binary, for tests and
benchmarks: a primary with a replica watched by three sentinels (`SentinelGroup`), and a
three-primary Redis Cluster (`Cluster`); free ports, a directory of the caller's."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from tasks.errors import ConfigurationError
from tasks.host.processes import free_port
from tasks.testing.child import Child

SERVICE = "playrun"


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ConfigurationError(f"{name} is not installed (Debian: redis-server, redis-tools)")
    return found


def _bus_port() -> int:
    """A free port whose cluster bus port (10000 above) is free and valid too."""
    for _ in range(100):
        port = free_port()
        if port <= 55535:
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port
    raise ConfigurationError("no free port pair for a cluster node")


def eventually(check: Any, timeout: float, what: str) -> None:
    """Poll `check` until it holds, or raise naming `what`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class Node(Child):
    """One redis-server (or sentinel) process with a config file of its own."""

    ready_timeout = 30.0

    def __init__(self, directory: Path, name: str, lines: list[str], *,
                 sentinel: bool = False, cluster_bus: bool = False) -> None:
        self.port = _bus_port() if cluster_bus else free_port()
        self.directory = directory / name
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "redis.conf"
        conf.write_text("\n".join([f"port {self.port}", "bind 127.0.0.1", f"dir {self.directory}",
                                   "save \"\"", "appendonly no", *lines]) + "\n")
        argv = [_binary("redis-server"), str(conf), *(["--sentinel"] if sentinel else [])]
        super().__init__(name, argv, {}, self.directory / f"{name}.log")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)

    def command(self, *args: Any) -> Any:
        """One command, its reply as redis-py parses it."""
        return self.client().execute_command(*args)  # type: ignore[no-untyped-call]

    def info(self, section: str) -> dict[str, Any]:
        found: dict[str, Any] = self.client().info(section)  # type: ignore[assignment]
        return found

    def is_ready(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False


class SentinelGroup:
    """A primary, a replica and three sentinels (quorum 2) that fail over within ~2 s."""

    def __init__(self, directory: Path) -> None:
        self.primary = Node(directory, "primary", [])
        self.replica = Node(directory, "replica", [])
        self.sentinels: list[Node] = []
        self.directory = directory

    def start(self) -> SentinelGroup:
        self.primary.start().wait_ready()
        self.replica.start().wait_ready()
        self.replica.client().replicaof("127.0.0.1", self.primary.port)
        for i in range(3):
            node = Node(self.directory, f"sentinel{i}", [
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2",
                f"sentinel down-after-milliseconds {SERVICE} 1000",
                f"sentinel failover-timeout {SERVICE} 5000",
                f"sentinel parallel-syncs {SERVICE} 1",
            ], sentinel=True)
            self.sentinels.append(node.start().wait_ready())
        eventually(self._settled, timeout=30,
                   what="the sentinels to see the replica and each other")
        return self

    def _settled(self) -> bool:
        try:
            info = self.sentinels[0].command("SENTINEL", "MASTER", SERVICE)
        except redis.RedisError:
            return False
        if isinstance(info, list):
            info = dict(zip(info[::2], info[1::2], strict=True))
        fields: dict[str, Any] = {(k.decode() if isinstance(k, bytes) else str(k)): v
                                  for k, v in info.items()}
        replicas = int(fields.get("num-slaves") or 0)
        others = int(fields.get("num-other-sentinels") or 0)
        return replicas >= 1 and others >= 2 and self.replica_synced()

    def replica_synced(self) -> bool:
        try:
            info = self.replica.info("replication")
        except redis.RedisError:
            return False
        return info.get("master_link_status") == "up"

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/{db}"

    def primary_port(self) -> int:
        addr = self.sentinels[0].command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return int(addr[1])

    def failover(self) -> int:
        """SENTINEL FAILOVER; the new primary's port once every sentinel names it."""
        old = self.primary_port()
        self.sentinels[0].command("SENTINEL", "FAILOVER", SERVICE)
        return self.wait_for_other_primary(old)

    def wait_for_other_primary(self, old: int) -> int:
        """The new primary's port once every sentinel names one other than `old` and it
        answers as a primary."""
        def promoted() -> bool:
            if not all(self._names_other(s, old) for s in self.sentinels):
                return False
            node = self.replica if self.replica.port != old else self.primary
            try:
                return node.info("replication").get("role") == "master"
            except redis.RedisError:  # still starting
                return False
        eventually(promoted, timeout=30, what="the sentinels to name a new primary")
        return self.primary_port()

    @staticmethod
    def _names_other(sentinel: Node, old: int) -> bool:
        try:
            addr = sentinel.command(
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        except redis.RedisError:
            return False
        return int(addr[1]) != old

    def stop(self) -> None:
        for node in (*self.sentinels, self.replica, self.primary):
            node.stop()


class Cluster:
    """Three primaries, no replicas: every slot covered once."""

    def __init__(self, directory: Path) -> None:
        self.nodes = [Node(directory, f"node{i}", [
            "cluster-enabled yes", "cluster-config-file nodes.conf",
            "cluster-node-timeout 5000"], cluster_bus=True) for i in range(3)]

    def start(self) -> Cluster:
        for node in self.nodes:
            node.start().wait_ready()
        subprocess.run([_binary("redis-cli"), "--cluster", "create",
                        *(f"127.0.0.1:{n.port}" for n in self.nodes), "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        eventually(self._ok, timeout=30, what="the cluster to report state ok")
        return self

    def _ok(self) -> bool:
        for node in self.nodes:
            try:
                info = node.command("CLUSTER", "INFO")
            except redis.RedisError:
                return False
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
        return True

    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
