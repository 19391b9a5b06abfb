"""A network partition at the packet level (iptables on loopback), for one TCP port.

Userspace proxies cannot stand in for this: a proxy that stops forwarding still has its
kernel acknowledge every packet and answer every keepalive, so a client never learns the
far side is gone. Dropped packets are what a real partition or a vanished host looks like.

`cut()` drops every packet to and from the port. `heal(keep_dead=True)` lets new
connections through while the ones open at that moment stay silent for good, as after
a failover whose old host is gone or a NAT that forgot them: only a client with its own
timeouts ever notices. Needs root and iptables; `clear()` removes every rule it added.
"""

from __future__ import annotations

import os
import shutil
import subprocess

_CHAIN = "INPUT"


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "not root: cannot add iptables rules"
    if shutil.which("iptables") is None:
        return "no iptables (apt-get install iptables)"
    probe = subprocess.run(["iptables", "-w", "5", "-L", _CHAIN, "-n"], capture_output=True)
    if probe.returncode != 0:
        return f"iptables refused: {probe.stderr.decode(errors='replace').strip()[:200]}"
    return None


class Partition:
    def __init__(self, port: int) -> None:
        self.port = port
        self._rules: list[list[str]] = []
        self._blanket: list[list[str]] = []

    def _add(self, match: list[str]) -> list[str]:
        rule = ["-i", "lo", "-p", "tcp", *match, "-j", "DROP"]
        subprocess.run(["iptables", "-w", "5", "-I", _CHAIN, *rule], check=True)
        self._rules.append(rule)
        return rule

    def _remove(self, rule: list[str]) -> None:
        subprocess.run(["iptables", "-w", "5", "-D", _CHAIN, *rule], check=False,
                       capture_output=True)
        self._rules.remove(rule)

    def cut(self) -> None:
        self._blanket = [self._add(["--dport", str(self.port)]),
                         self._add(["--sport", str(self.port)])]

    def open_client_ports(self) -> list[int]:
        """Local ports of the clients connected to the port now (from `ss`)."""
        out = subprocess.run(["ss", "-Htn", "state", "established",
                              f"( dport = :{self.port} )"], capture_output=True, text=True,
                             check=True).stdout
        ports = []
        for line in out.splitlines():
            fields = line.split()
            local = next((f for f in fields if f.startswith(("127.", "[::1]"))), "")
            if local.rpartition(":")[2].isdigit():
                ports.append(int(local.rpartition(":")[2]))
        return sorted(set(ports))

    def heal(self, *, keep_dead: bool = True) -> int:
        """Let traffic through again; with keep_dead the connections established now stay
        dead. Returns how many were kept dead."""
        dead = self.open_client_ports() if keep_dead else []
        for client in dead:
            self._add(["--sport", str(client), "--dport", str(self.port)])
            self._add(["--sport", str(self.port), "--dport", str(client)])
        for rule in self._blanket:
            self._remove(rule)
        self._blanket = []
        return len(dead)

    def clear(self) -> None:
        for rule in list(self._rules):
            self._remove(rule)
