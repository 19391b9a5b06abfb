"""The Modal double's state: sandboxes as local process trees, and the injected faults.

Everything here runs on the double's event loop thread; the test thread reads counters
under `lock`. A sandbox's filesystem is a directory that stands in for the sandbox's
/tmp/playrun (paths are rewritten), and ends with the sandbox, as Modal's does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from grpclib import GRPCError, Status
from modal_proto import api_pb2

# The sandbox path the double maps onto each sandbox's own directory.
VIRTUAL_ROOT = "/tmp/playrun"
# What Modal answers (modal.exception.ResourceExhaustedError on the client).
RATE_TEXT = "Sandbox creation rate limit exceeded"
CAPACITY_TEXT = "Insufficient capacity to create sandbox."
LIMIT_TEXT = "Your workspace has reached its limit of {n} running sandboxes."
AUTH_TEXT = "Invalid token id or secret"


@dataclass
class Box:
    id: str
    task_id: str
    app_id: str
    name: str
    tags: dict[str, str]
    created_at: float
    root: Path
    env: dict[str, str]
    network: api_pb2.NetworkAccess
    timeout_secs: int
    entry: asyncio.subprocess.Process | None = None
    result: api_pb2.GenericResult | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    execs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None

    def vmap(self, text: str) -> str:
        return text.replace(VIRTUAL_ROOT, str(self.root))


@dataclass
class Fault:
    kind: str
    retry_after_s: float | None


def jwt(ttl_s: float = 3600.0) -> str:
    """An unsigned JWT: the SDK reads its exp to know when to refresh, and nothing else."""

    def part(doc: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part({'exp': int(time.time() + ttl_s)})}.sig"


class World:
    def __init__(
        self,
        base: Path,
        *,
        creates_per_min: float | None,
        max_live: int | None,
        create_latency_s: float,
        page_size: int = 5,
    ) -> None:
        self.base = base
        self.token_id = "ak-" + secrets.token_hex(8)
        self.token_secret = "as-" + secrets.token_hex(16)
        self.router_url = ""
        self.creates_per_min = creates_per_min
        self.max_live = max_live
        self.create_latency_s = create_latency_s
        self.page_size = page_size
        self.lost_answer_delay_s = 0.0
        self.apps: dict[tuple[str, str], str] = {}
        self.boxes: dict[str, Box] = {}
        self.faults: deque[Fault] = deque()
        self.lose_answers = 0
        self.accepted: deque[float] = deque()
        self.lock = threading.Lock()
        self.created = 0
        self.rate_rejections = 0
        self.peak_live = 0
        self.requests: list[object] = []

    # -- auth and pushback ---------------------------------------------------------------

    def check_token(self, metadata: object) -> None:
        get = getattr(metadata, "get", None)
        token_id = get("x-modal-token-id") if get else None
        token_secret = get("x-modal-token-secret") if get else None
        auth_token = get("x-modal-auth-token") if get else None
        if (token_id, token_secret) == (self.token_id, self.token_secret) or auth_token:
            return
        raise GRPCError(Status.UNAUTHENTICATED, AUTH_TEXT)

    def admit_create(self, now: float) -> None:
        """Raises what Modal answers a create it refuses."""
        if self.faults:
            fault = self.faults.popleft()
            raise self._pushback(fault.kind, fault.retry_after_s)
        if self.creates_per_min is not None:
            while self.accepted and self.accepted[0] <= now - 60.0:
                self.accepted.popleft()
            if len(self.accepted) >= self.creates_per_min:
                wait = max(0.1, self.accepted[0] + 60.0 - now)
                raise self._pushback("rate_limited", wait)
        if self.max_live is not None and self.live() >= self.max_live:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, LIMIT_TEXT.format(n=self.max_live))

    def _pushback(self, kind: str, retry_after_s: float | None) -> GRPCError:
        details = None
        if retry_after_s is not None:
            details = [api_pb2.RPCRetryPolicy(retry_after_secs=retry_after_s)]
        if kind == "rate_limited":
            with self.lock:
                self.rate_rejections += 1
            return GRPCError(Status.RESOURCE_EXHAUSTED, RATE_TEXT, details)
        if kind == "capacity_unavailable":
            return GRPCError(Status.RESOURCE_EXHAUSTED, CAPACITY_TEXT, details)
        if kind == "auth":
            return GRPCError(Status.UNAUTHENTICATED, AUTH_TEXT)
        raise ValueError(f"unknown pushback {kind!r}")

    # -- sandboxes -----------------------------------------------------------------------

    def live(self) -> int:
        return sum(1 for box in self.boxes.values() if box.result is None)

    def by_task(self, task_id: str) -> Box:
        for box in self.boxes.values():
            if box.task_id == task_id:
                if box.result is not None:
                    raise GRPCError(Status.NOT_FOUND, f"Task {task_id} has finished")
                return box
        raise GRPCError(Status.NOT_FOUND, f"Task {task_id} not found")

    def get(self, sandbox_id: str) -> Box:
        try:
            return self.boxes[sandbox_id]
        except KeyError:
            raise GRPCError(Status.NOT_FOUND, f"Sandbox {sandbox_id} not found") from None

    def running_named(self, app_id: str, name: str) -> Box | None:
        for box in self.boxes.values():
            if box.name and box.name == name and box.app_id == app_id and box.result is None:
                return box
        return None

    def new_box(
        self, app_id: str, definition: api_pb2.Sandbox, env: dict[str, str], tags: dict[str, str]
    ) -> Box:
        sandbox_id = "sb-" + secrets.token_hex(10)
        created = time.time()
        # Pages follow created_at, so two sandboxes never share one.
        while any(b.created_at >= created for b in self.boxes.values()):
            created += 1e-4
        root = self.base / sandbox_id
        root.mkdir(parents=True)
        box = Box(
            id=sandbox_id,
            task_id="ta-" + secrets.token_hex(10) + "V",
            app_id=app_id,
            name=definition.name,
            tags=tags,
            created_at=created,
            root=root,
            env=env,
            network=definition.network_access,
            timeout_secs=definition.timeout_secs,
        )
        self.boxes[sandbox_id] = box
        with self.lock:
            self.created += 1
            self.peak_live = max(self.peak_live, self.live())
        self.accepted.append(created)
        return box

    def process_env(self, box: Box, extra: dict[str, str]) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(box.root),
            "MODAL_SANDBOX_ID": box.id,
            "MODAL_TASK_ID": box.task_id,
        }
        env.update({k: box.vmap(v) for k, v in {**box.env, **extra}.items()})
        return env

    async def start_entry(self, box: Box, argv: list[str]) -> None:
        log = open(self.base / f"{box.id}.log", "ab")  # noqa: SIM115 - the child keeps it
        try:
            box.entry = await asyncio.create_subprocess_exec(
                *[box.vmap(a) for a in argv],
                cwd=box.root,
                env=self.process_env(box, {}),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()
        loop = asyncio.get_running_loop()
        if box.timeout_secs:
            box.timer = loop.call_later(
                box.timeout_secs, self.finish, box, api_pb2.GenericResult.GENERIC_STATUS_TIMEOUT, 0
            )
        loop.create_task(self._watch(box, box.entry))

    async def _watch(self, box: Box, entry: asyncio.subprocess.Process) -> None:
        code = await entry.wait()
        if code == 0:
            self.finish(box, api_pb2.GenericResult.GENERIC_STATUS_SUCCESS, 0)
        else:
            self.finish(
                box, api_pb2.GenericResult.GENERIC_STATUS_FAILURE, 128 - code if code < 0 else code
            )

    def finish(self, box: Box, status: int, exitcode: int) -> None:
        """The sandbox ends: its processes are killed and its filesystem is gone."""
        if box.result is not None:
            return
        box.result = api_pb2.GenericResult(status=status, exitcode=exitcode)  # type: ignore[arg-type]
        if box.timer is not None:
            box.timer.cancel()
        kill_tree(box.id)
        shutil.rmtree(box.root, ignore_errors=True)
        box.ended.set()


def sandbox_pids(sandbox_id: str) -> list[int]:
    """Processes of a sandbox: every one carries its MODAL_SANDBOX_ID, setsid or not."""
    mark = f"MODAL_SANDBOX_ID={sandbox_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if mark in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_tree(sandbox_id: str) -> None:
    for _ in range(20):  # a process may fork while we kill: until none is left
        pids = sandbox_pids(sandbox_id)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
