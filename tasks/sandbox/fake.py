"""The `fake` provider: the local provider plus a fault script shared by every process.

Tests and benchmarks script faults in `<root>/fake-script.json`; worker subprocesses consume
them under an flock, so each scripted fault is used exactly once fleet-wide (docs/providers/).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from tasks.constants import RESULT_FILE
from tasks.sandbox.base import (
    ERROR_KINDS,
    CapacityUnavailableError,
    ExitReport,
    ProcessStatus,
    SandboxNotFoundError,
    SandboxRef,
    SandboxSpec,
    error_for_kind,
)
from tasks.sandbox.fake_runners import EXIT_FILE, HOSTED_MARK, SPOOL_DIR
from tasks.sandbox.local import LocalProvider

SCRIPT_FILE = "fake-script.json"
LOCK_FILE = "fake-script.lock"
MAX_CREATE_TIMES = 10_000
NO_CAPACITY_MESSAGE = "no capacity"
SCRIPTABLE_KINDS = tuple(kind for kind in ERROR_KINDS if kind != "not_found")


def _initial_state() -> dict[str, Any]:
    return {
        "fail_creates": [],
        "latency_ms": 0,
        "max_creates_per_s": None,
        "lose_runner": 0,
        "creates_ok": 0,
        "creates_begun": 0,  # asked of the provider, decided or not (a sign for tests)
        "creates_rejected": {},
        "create_times": [],
        "runners_lost": 0,
        # Runners run as coroutines of a fake runner host (fake_runners.py), not processes.
        "hosted_runners": False,
    }


class FakeScript:
    """Read and change the fault script; every access holds an flock on a sidecar file."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / SCRIPT_FILE

    @contextmanager
    def _locked(self, *, write: bool) -> Iterator[dict[str, Any]]:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
            state = _initial_state()
            with suppress(FileNotFoundError):
                state.update(json.loads(self.path.read_bytes()))
            before = json.dumps(state) if write else ""
            yield state
            after = json.dumps(state) if write else ""
            if after != before:  # unchanged: no rewrite (every launch asks, few change it)
                tmp = self.path.with_name(f".{SCRIPT_FILE}.tmp")
                tmp.write_text(after)
                os.replace(tmp, self.path)
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def set(
        self,
        *,
        fail_creates: Sequence[str] = (),
        latency_ms: int = 0,
        max_creates_per_s: float | None = None,
        lose_runner: int = 0,
        hosted_runners: bool = False,
    ) -> None:
        """Replace the script (counters are kept; `reset` clears them too)."""
        unknown = [kind for kind in fail_creates if kind not in SCRIPTABLE_KINDS]
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; use {SCRIPTABLE_KINDS}")
        with self._locked(write=True) as state:
            state["fail_creates"] = list(fail_creates)
            state["latency_ms"] = int(latency_ms)
            state["max_creates_per_s"] = max_creates_per_s
            state["lose_runner"] = int(lose_runner)
            state["hosted_runners"] = bool(hosted_runners)

    def reset(self) -> None:
        with self._locked(write=True) as state:
            state.clear()
            state.update(_initial_state())

    def state(self) -> dict[str, Any]:
        with self._locked(write=False) as state:
            return state

    def admit_create(self) -> None:
        """Decide one create: pop a scripted fault or enforce the rate, else record it."""
        with self._locked(write=True) as state:
            state["creates_begun"] = int(state.get("creates_begun", 0)) + 1
            latency_ms = int(state["latency_ms"])
            if latency_ms <= 0:
                kind = self._decide(state)
        if latency_ms > 0:
            time.sleep(latency_ms / 1000.0)  # outside the lock, as a provider's API call
            with self._locked(write=True) as state:
                kind = self._decide(state)
        if kind == "capacity_unavailable":
            raise CapacityUnavailableError(NO_CAPACITY_MESSAGE)
        if kind is not None:
            raise error_for_kind(kind, f"scripted {kind} fault")

    @staticmethod
    def _decide(state: dict[str, Any]) -> str | None:
        """Under the write lock: the scripted fault this create meets, if any."""
        now = time.time()
        kind: str | None = None
        if state["fail_creates"]:
            kind = str(state["fail_creates"].pop(0))
        else:
            limit = state["max_creates_per_s"]
            recent = sum(1 for t in state["create_times"] if t > now - 1.0)
            if limit is not None and recent >= limit:
                kind = "capacity_unavailable"
        if kind is None:
            state["creates_ok"] += 1
            kept = state["create_times"]
            if state["max_creates_per_s"] is None:
                # No rate scripted: the last second is all anyone reads; a file that grew
                # with every create would cost each one more than the create it stands for.
                kept = [t for t in kept if t > now - 1.0]
            state["create_times"] = (kept + [now])[-MAX_CREATE_TIMES:]
        else:
            rejected = state["creates_rejected"]
            rejected[kind] = rejected.get(kind, 0) + 1
        return kind

    def take_launch(self) -> tuple[bool, bool]:
        """For one exec, under one lock: (this runner is to be lost, runners are hosted)."""
        with self._locked(write=True) as state:
            lose = state["lose_runner"] > 0
            if lose:
                state["lose_runner"] -= 1
                state["runners_lost"] += 1
            return lose, bool(state["hosted_runners"])


class FakeProvider(LocalProvider):
    """Executes exactly like `local`; creates and launches consult the fault script first."""

    name = "fake"
    id_prefix = "fsb"
    # Hosted runners have no supervisor to report an exit: the heartbeat timeout notices it.
    reports_exit = False

    def __init__(self, root: Path, *, pid_namespace: bool | None = None) -> None:
        super().__init__(root, pid_namespace=pid_namespace)
        self.script = FakeScript(root)

    def create(self, spec: SandboxSpec) -> SandboxRef:
        self.script.admit_create()
        return super().create(spec)

    def exec_detached(
        self,
        sandbox_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        timeout_s: float,
        report: ExitReport | None = None,
    ) -> None:
        lose, hosted = self.script.take_launch()
        if hosted:
            self._hand_to_host(sandbox_id, env, lose)
            return
        super().exec_detached(sandbox_id, argv, env=env, timeout_s=timeout_s)
        if lose:
            # A lost runner: its whole tree dies before it can leave an exit record or result.
            self.kill(sandbox_id)
            (self.root / sandbox_id / RESULT_FILE).unlink(missing_ok=True)

    def _hand_to_host(self, sandbox_id: str, env: Mapping[str, str], lose: bool) -> None:
        path = self.root / sandbox_id
        if not path.is_dir():
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r}")
        (path / HOSTED_MARK).write_text("1")
        if lose:
            # Lost before it could leave anything: an exit record without a result.
            (path / EXIT_FILE).write_text(json.dumps({"exit_code": 137, "timed_out": False}))
            return
        spool = self.root / SPOOL_DIR
        spool.mkdir(parents=True, exist_ok=True)
        tmp = spool / f".{sandbox_id}.tmp"
        tmp.write_text(json.dumps({"dir": str(path), "env": dict(env)}))
        os.replace(tmp, spool / f"{sandbox_id}.json")

    def kill(self, sandbox_id: str) -> None:
        path = self._path(sandbox_id)
        if path is not None and (path / HOSTED_MARK).is_file():
            # No process to kill: a hosted runner is a coroutine of the runner host, which
            # ends it once the directory is gone. A /proc scan would find nothing, slowly.
            return
        super().kill(sandbox_id)

    def poll(self, sandbox_id: str) -> ProcessStatus:
        path = self.root / sandbox_id
        if not (path / HOSTED_MARK).is_file():
            return super().poll(sandbox_id)
        with suppress(FileNotFoundError, ValueError):
            record = json.loads((path / EXIT_FILE).read_bytes())
            return ProcessStatus(state="exited", exit_code=int(record["exit_code"]))
        return ProcessStatus(state="running" if path.is_dir() else "missing")
