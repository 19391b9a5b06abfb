"""The Daytona double's state: sandboxes as local directories, their commands as processes.

A sandbox's filesystem is a directory; its workdir (/tmp/playrun) maps onto <dir>/workdir
and any other absolute path onto <dir>/root/<path>. Every process started in a sandbox
carries DAYTONA_SANDBOX_ID (as a real one does), which is how the double finds them to kill.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.sandbox.providers.bootstrap import STARTED_FILE, WORKDIR

ORG = "org-playrun-double"
CAPACITY_TEXT = "Total CPU limit exceeded. Maximum allowed: {n}."


@dataclass
class Box:
    id: str
    name: str
    labels: dict[str, str]
    env: dict[str, str]
    dir: Path
    created: float
    started_at: float  # when `creating` turns `started`
    settings: dict[str, Any] = field(default_factory=dict)

    def state(self) -> str:
        return "started" if time.time() >= self.started_at else "creating"

    def local(self, path: str) -> Path:
        """Where a sandbox path lives on this machine."""
        if path == WORKDIR or path.startswith(WORKDIR + "/"):
            return self.dir / "workdir" / path[len(WORKDIR) :].lstrip("/")
        if not path.startswith("/"):
            return self.dir / "workdir" / path
        return self.dir / "root" / path.lstrip("/")

    def rewrite(self, command: str) -> str:
        return command.replace(WORKDIR, str(self.dir / "workdir"))


def iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"


def dto(box: Box, *, full: bool = True, base_url: str = "") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": box.id,
        "organizationId": ORG,
        "name": box.name,
        "user": "daytona",
        "labels": box.labels,
        "public": False,
        "networkBlockAll": bool(box.settings.get("networkBlockAll")),
        "target": "us",
        "cpu": 1,
        "gpu": 0,
        "memory": 1,
        "disk": 3,
        "state": box.state(),
        "desiredState": "started",
        "snapshot": "daytonaio/sandbox:0.4.3",
        "autoStopInterval": box.settings.get("autoStopInterval", 15),
        "autoDeleteInterval": box.settings.get("autoDeleteInterval", -1),
        "createdAt": iso(box.created),
        "updatedAt": iso(box.created),
        "toolboxProxyUrl": f"{base_url}/toolbox",
    }
    if full:
        doc.update(
            env=box.env,
            kvm=False,
            networkAllowList=box.settings.get("networkAllowList"),
            domainAllowList=box.settings.get("domainAllowList"),
        )
    return doc


class Fleet:
    """Every sandbox of the double, its injected faults and its counters."""

    def __init__(
        self,
        root: Path,
        *,
        creates_per_min: float | None,
        max_live: int | None,
        create_latency_s: float,
    ) -> None:
        self.root = root
        self.creates_per_min = creates_per_min
        self.max_live = max_live
        self.create_latency_s = create_latency_s
        self.refusal_latency_s = 0.0  # how long a refused create waits for its answer
        self.refusing = 0  # refused creates whose answer is still being held
        self.lock = threading.Lock()
        self.boxes: dict[str, Box] = {}
        self.pushbacks: deque[tuple[str, float | None]] = deque()
        self.lose_next = 0
        self.accepted: deque[float] = deque()  # create times in the last minute
        self.created = 0
        self.rejected = 0
        self.max_seen = 0
        self.requests: list[dict[str, Any]] = []  # every create body, as sent

    # -- control plane ---------------------------------------------------------------

    def admit(self, now: float) -> tuple[int, dict[str, Any], dict[str, str]] | None:
        """The pushback answer for a create arriving now, if it gets one."""
        if self.pushbacks:
            kind, after = self.pushbacks.popleft()
            return self._pushback(kind, after, now)
        if self.creates_per_min is not None:
            while self.accepted and now - self.accepted[0] >= 60.0:
                self.accepted.popleft()
            if len(self.accepted) >= self.creates_per_min:
                return self._pushback("rate_limited", 60.0 - (now - self.accepted[0]), now)
        if self.max_live is not None and len(self.boxes) >= self.max_live:
            return self._pushback("capacity_unavailable", None, now)
        return None

    def _pushback(
        self, kind: str, after: float | None, now: float
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        headers: dict[str, str] = {}
        if after is not None:
            headers["Retry-After"] = str(max(1, round(after)))
        if kind == "rate_limited":
            self.rejected += 1
            limit = int(self.creates_per_min or 600)
            wait = headers.setdefault("Retry-After", "60")
            headers.update(
                {
                    "X-RateLimit-Limit-sandbox-create": str(limit),
                    "X-RateLimit-Remaining-sandbox-create": "0",
                    "X-RateLimit-Reset-sandbox-create": wait,
                    "Retry-After-sandbox-create": wait,
                }
            )
            return (
                429,
                {"statusCode": 429, "message": "Rate limit exceeded", "error": "Too Many Requests"},
                headers,
            )
        if kind == "auth":
            return (
                401,
                {"statusCode": 401, "message": "Invalid API key", "error": "Unauthorized"},
                headers,
            )
        text = CAPACITY_TEXT.format(n=self.max_live or len(self.boxes))
        return 400, {"statusCode": 400, "message": text, "error": "Bad Request"}, headers

    def make(self, body: dict[str, Any], now: float) -> Box:
        box_id = str(uuid.uuid4())
        name = body.get("name") or box_id
        box = Box(
            id=box_id,
            name=name,
            labels=dict(body.get("labels") or {}),
            env=dict(body.get("env") or {}),
            dir=self.root / box_id,
            created=now,
            started_at=now + self.create_latency_s,
        )
        for key in (
            "autoStopInterval",
            "autoDeleteInterval",
            "ttlMinutes",
            "networkBlockAll",
            "networkAllowList",
            "domainAllowList",
        ):
            if key in body:
                box.settings[key] = body[key]
        (box.dir / "workdir").mkdir(parents=True)
        (box.dir / "root").mkdir()
        self.boxes[box_id] = box
        self.accepted.append(now)
        self.created += 1
        self.max_seen = max(self.max_seen, len(self.boxes))
        return box

    def find(self, id_or_name: str) -> Box | None:
        box = self.boxes.get(id_or_name)
        if box is None:
            box = next((b for b in self.boxes.values() if b.name == id_or_name), None)
        return box

    def destroy(self, box: Box) -> None:
        self.boxes.pop(box.id, None)
        kill_processes(box.id)
        shutil.rmtree(box.dir, ignore_errors=True)

    # -- toolbox ---------------------------------------------------------------------

    def execute(self, box: Box, body: dict[str, Any]) -> dict[str, Any]:
        """POST /process/execute: the daemon pipes the command to a shell in its own group."""
        timeout = body.get("timeout") or 360
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(box.dir / "workdir"),
            "LANG": "C.UTF-8",
            **box.env,
            **(body.get("envs") or {}),
            "DAYTONA_SANDBOX_ID": box.id,
        }
        cwd = box.local(body["cwd"]) if body.get("cwd") else box.dir / "workdir"
        try:
            done = subprocess.run(
                ["sh"],
                input=box.rewrite(body["command"]).encode(),
                cwd=cwd,
                env=env,
                capture_output=True,
                timeout=timeout,
                start_new_session=True,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"Command execution timed out after {timeout} seconds") from exc
        output = (done.stdout + done.stderr).decode("utf-8", "replace")
        return {"exitCode": done.returncode, "result": output}

    def kill_runner(self, box: Box) -> None:
        """Kill the boot script's keeper and the runner's group; the sandbox stays."""
        try:
            started = json.loads(box.local(f"{WORKDIR}/{STARTED_FILE}").read_text())
        except (OSError, ValueError):
            started = {}
        for key in ("pid", "keeper"):
            pid = started.get(key)
            if isinstance(pid, int):
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        kill_processes(box.id)


def kill_processes(box_id: str) -> None:
    """SIGKILL every process whose environment names this sandbox."""
    marker = f"DAYTONA_SANDBOX_ID={box_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)
