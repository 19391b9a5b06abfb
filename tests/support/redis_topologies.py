"""Private Redis topologies on loopback from the redis-server binary: a primary with a
replica watched by three sentinels, and a three-primary Cluster (free ports, temporary
directories, stopped by the fixture that started them)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tasks.host.processes import free_port
from tasks.testing.child import Child
from tests.support.helpers import eventually

SERVICE = "playrun"


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    return found


class Node(Child):
    """One redis-server (or sentinel) process with a config file of its own."""

    ready_timeout = 30.0

    def __init__(self, directory: Path, name: str, lines: list[str], *,
                 sentinel: bool = False) -> None:
        self.port = free_port()
        self.directory = directory / name
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "redis.conf"
        conf.write_text("\n".join([f"port {self.port}", "bind 127.0.0.1", f"dir {self.directory}",
                                   "save \"\"", "appendonly no", *lines]) + "\n")
        argv = [redis_binary(), str(conf), *(["--sentinel"] if sentinel else [])]
        super().__init__(name, argv, {}, self.directory / f"{name}.log")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)

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
            info = self.sentinels[0].client().execute_command("SENTINEL", "MASTER", SERVICE)
        except redis.RedisError:
            return False
        fields = dict(zip(info[::2], info[1::2], strict=True)) if isinstance(info, list) else info
        replicas = int(fields.get(b"num-slaves", fields.get("num-slaves", 0)))
        others = int(fields.get(b"num-other-sentinels", fields.get("num-other-sentinels", 0)))
        return replicas >= 1 and others >= 2 and self.replica_synced()

    def replica_synced(self) -> bool:
        try:
            info = self.replica.client().info("replication")
        except redis.RedisError:
            return False
        return info.get("master_link_status") == "up"

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/{db}"

    def primary_port(self) -> int:
        addr = self.sentinels[0].client().execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return int(addr[1])

    def failover(self) -> int:
        """SENTINEL FAILOVER; the new primary's port once every sentinel names it."""
        old = self.primary_port()
        self.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", SERVICE)
        return self.wait_for_other_primary(old)

    def wait_for_other_primary(self, old: int) -> int:
        """The new primary's port once every sentinel names one other than `old` and it
        answers as a primary."""
        def promoted() -> bool:
            if not all(self._names_other(s, old) for s in self.sentinels):
                return False
            node = self.replica if self.replica.port != old else self.primary
            try:
                return node.client().info("replication").get("role") == "master"
            except redis.RedisError:  # still starting
                return False
        eventually(promoted, timeout=30, what="the sentinels to name a new primary")
        return self.primary_port()

    @staticmethod
    def _names_other(sentinel: Node, old: int) -> bool:
        try:
            addr = sentinel.client().execute_command(
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
            "cluster-node-timeout 5000"]) for i in range(3)]

    def start(self) -> Cluster:
        for node in self.nodes:
            node.start().wait_ready()
        cli = shutil.which("redis-cli")
        if cli is None:
            pytest.skip("redis-cli is not installed (apt-get install redis-tools)")
        subprocess.run([cli, "--cluster", "create",
                        *(f"127.0.0.1:{n.port}" for n in self.nodes), "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        eventually(self._ok, timeout=30, what="the cluster to report state ok")
        return self

    def _ok(self) -> bool:
        for node in self.nodes:
            try:
                info = node.client().execute_command("CLUSTER", "INFO")
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


def most_in_window(times: list[float], window_s: float) -> int:
    """The most starts any window of `window_s` seconds holds."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def started(topology: SentinelGroup | Cluster) -> Iterator[Any]:
    """For a fixture: the topology started, and stopped after the test."""
    try:
        yield topology.start()
    finally:
        topology.stop()
