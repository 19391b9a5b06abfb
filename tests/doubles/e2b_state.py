"""The E2B double's world: sandboxes as local directories, their processes, the knobs.

Shared by the control plane (e2b_api.py) and envd (e2b_envd.py); every field is
guarded by one lock because the server's event loop and the test thread both read it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The sandbox paths the adapter uses, mapped onto each sandbox's directory.
WORKDIR = "/tmp/playrun"
HOME = "/home/user"
ENVD_VERSION = "0.6.3"
# The variable real sandboxes carry; here it also finds a sandbox's processes in /proc.
SANDBOX_ID_VAR = "E2B_SANDBOX_ID"
# Host variables a sandbox process keeps (a real sandbox has its own image).
HOST_VARS = ("PATH", "LANG", "LC_ALL", "TZ", "SSL_CERT_FILE", "TMPDIR")


@dataclass
class Box:
    sandbox_id: str
    template: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    network: dict[str, Any] | None
    root: Path
    token: str
    started_at: float
    end_at: float
    procs: dict[int, Any] = field(default_factory=dict)  # pid -> (asyncio process, config)

    def local(self, path: str) -> Path:
        """A sandbox path on the host: workdir and home are the sandbox's directory."""
        for prefix in (WORKDIR, HOME):
            if path == prefix or path.startswith(prefix + "/"):
                return self.root / path[len(prefix) :].lstrip("/")
        if not path.startswith("/"):
            return self.root / path
        return self.root / "rootfs" / path.lstrip("/")

    def rewrite(self, text: str) -> str:
        return text.replace(WORKDIR, str(self.root)).replace(HOME, str(self.root))

    def answer(self) -> dict[str, Any]:
        return {
            "templateID": self.template,
            "sandboxID": self.sandbox_id,
            "clientID": "double",
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": self.token,
        }

    def listed(self) -> dict[str, Any]:
        return {
            "templateID": self.template,
            "sandboxID": self.sandbox_id,
            "clientID": "double",
            "startedAt": _iso(self.started_at),
            "endAt": _iso(self.end_at),
            "cpuCount": 2,
            "memoryMB": 512,
            "diskSizeMB": 1024,
            "state": "running",
            "envdVersion": ENVD_VERSION,
            "metadata": dict(self.metadata),
        }


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}Z"


@dataclass
class Pushback:
    kind: str
    retry_after_s: float | None


class World:
    """Everything the double knows; the test thread reads counters through E2BDouble."""

    def __init__(
        self,
        root: Path,
        *,
        api_key: str,
        creates_per_min: float | None,
        max_live: int | None,
        create_latency_s: float,
    ) -> None:
        self.root = root
        self.api_key = api_key
        self.creates_per_min = creates_per_min
        self.max_live = max_live
        self.create_latency_s = create_latency_s
        self.lock = threading.Lock()
        self.boxes: dict[str, Box] = {}
        self.keys: dict[str, tuple[str, str]] = {}  # idempotency key -> (body digest, id)
        self.pushbacks: deque[Pushback] = deque()
        self.lost_answers = 0
        self.lost_answer_delay_s = 0.0
        self.create_times: deque[float] = deque()
        self.n_creates = 0
        self.n_rejected_429 = 0
        self.peak_live = 0
        self.closing = False
        self.started: list[tuple[str, float | None]] = []  # (command line, deadline ms)

    def new_box(
        self,
        template: str,
        metadata: dict[str, str],
        env_vars: dict[str, str],
        network: dict[str, Any] | None,
        timeout_s: float,
    ) -> Box:
        sandbox_id = "i" + secrets.token_hex(10)
        root = self.root / sandbox_id
        root.mkdir(parents=True)
        now = time.time()
        box = Box(
            sandbox_id,
            template,
            metadata,
            env_vars,
            network,
            root,
            secrets.token_hex(16),
            now,
            now + timeout_s,
        )
        with self.lock:
            self.boxes[sandbox_id] = box
            self.n_creates += 1
            self.peak_live = max(self.peak_live, len(self.boxes))
        return box

    def box(self, sandbox_id: str) -> Box | None:
        with self.lock:
            return self.boxes.get(sandbox_id)

    def remove(self, sandbox_id: str) -> bool:
        with self.lock:
            box = self.boxes.pop(sandbox_id, None)
        if box is None:
            return False
        kill_all(sandbox_id)
        shutil.rmtree(box.root, ignore_errors=True)
        return True

    def expire(self) -> None:
        """The sandbox's lifetime is the provider's: past end_at it is killed."""
        now = time.time()
        with self.lock:
            due = [b.sandbox_id for b in self.boxes.values() if b.end_at <= now]
        for sandbox_id in due:
            self.remove(sandbox_id)

    def proc_env(self, box: Box, extra: dict[str, str]) -> dict[str, str]:
        env = {k: os.environ[k] for k in HOST_VARS if k in os.environ}
        env.update(
            {
                "HOME": str(box.root),
                "USER": "user",
                "E2B_SANDBOX": "true",
                SANDBOX_ID_VAR: box.sandbox_id,
            }
        )
        env.update(box.env_vars)
        env.update(extra)
        return env


def sandbox_pids(sandbox_id: str) -> list[int]:
    """Every host process started in the sandbox, found by the variable it inherited."""
    marker = f"{SANDBOX_ID_VAR}={sandbox_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_all(sandbox_id: str) -> None:
    for pid in sandbox_pids(sandbox_id):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
