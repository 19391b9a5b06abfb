"""The stack under test, the mixed load driven through it, and the invariants checked after.

A stack is a `playrun gateway`, a separate beat, two workers of two slots (restarted at
once when killed, as a supervisor would: bench_recovery.Workers) and the local provider
with process isolation, so a play can append to a file on the host: the side-effect count
that proves nothing ran twice.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.bench_recovery import Workers
from bench.chaoslib.sheets import ROW_S, check_sheets, rows_for
from bench.common import Child, start_beat, start_gateway

PLAY = Path(__file__).resolve().parent.parent / "plays" / "chaos_mix.py"
TERMINAL = ("succeeded", "failed", "cancelled")
RUN_TIMEOUT_S = 30.0
HEARTBEAT_TIMEOUT_S = 10.0
# A run must be terminal this long after it was admitted (by the database clock): its
# timeout, the runner-lost detection and the reaper's interval, with room for a slow box.
DEADLINE_S = RUN_TIMEOUT_S + HEARTBEAT_TIMEOUT_S + 30.0
SETTLE_S = 60.0  # after the last terminal, for releases and sandbox GC to finish

STACK_SETTINGS = {
    "PLAYRUN_SANDBOX_PROVIDER": "local",
    "PLAYRUN_SANDBOX_ISOLATION": "process",
    "PLAYRUN_START_RATE_INITIAL_PER_MIN": "60000",
    "PLAYRUN_START_RATE_MAX_PER_MIN": "60000",
    "PLAYRUN_LEASE_SECONDS": "5",
    "PLAYRUN_REAP_INTERVAL_S": "1",
    "PLAYRUN_SWEEP_INTERVAL_S": "1",
    "PLAYRUN_OUTBOX_RESEND_AFTER_S": "5",
    "PLAYRUN_HEARTBEAT_INTERVAL_S": "1",
    "PLAYRUN_HEARTBEAT_TIMEOUT_S": f"{HEARTBEAT_TIMEOUT_S:g}",
    "PLAYRUN_RUN_TIMEOUT_S": f"{RUN_TIMEOUT_S:g}",
    "PLAYRUN_GC_INTERVAL_S": "2",
    "PLAYRUN_GC_GRACE_S": "5",
    "PLAYRUN_RELEASE_GRACE_S": "5",
    # Small sheet pages and writes: a map makes several of each, so a fault lands between.
    "PLAYRUN_SHEET_PAGE_ROWS": "10",
    "PLAYRUN_SHEET_WRITE_ROWS": "5",
}

# The mix, by run index modulo 10: five short no-ops, one sheet map, one long, one
# failing, two steps (the sheet at 4, so the 5-run test has one).
MIX = ["short"] * 4 + ["sheet", "short", "long", "fail", "step", "step"]
EXPECTED = {"short": "succeeded", "long": "succeeded", "step": "succeeded", "fail": "failed",
            "sheet": "succeeded"}


class Stack:
    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir = env, log_dir
        self.gateway: Child | None = None
        self.beat: Child | None = None
        self.workers: Workers | None = None

    def start(self) -> None:
        self.gateway = start_gateway(self.env, self.log_dir)
        self.beat = start_beat(self.env, self.log_dir)
        self.workers = Workers(self.env, self.log_dir)

    def restart_worker(self, i: int, env: dict[str, str]) -> None:
        """Worker i again, with another environment (a skewed clock)."""
        assert self.workers is not None
        w = self.workers.workers[i]
        w.stop()
        w.env = env
        w.start()
        self.workers.wait_ready(i)

    def restart(self, child: Child) -> None:
        """SIGKILL the process group and start it again at once (a supervisor's restart)."""
        child.stop(signal.SIGKILL)
        child.start()

    def stop(self) -> None:
        if self.workers is not None:
            self.workers.stop()
        for child in (self.beat, self.gateway):
            if child is not None:
                child.stop()


@dataclass
class Load:
    """n runs of the mix submitted at an even pace over `spread_s`, from a thread."""

    n: int
    spread_s: float
    marks: Path
    org: str = field(default_factory=lambda: f"chaos-{uuid.uuid4().hex[:6]}")
    ids: list[str] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)
    submit_errors: Counter[str] = field(default_factory=Counter)
    refused: list[int] = field(default_factory=list)  # indices whose submit_run raised
    index: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tag = uuid.uuid4().hex[:8]
        self._thread = threading.Thread(target=self._submit, daemon=True, name="chaos-load")

    def start(self) -> Load:
        from tasks.acquisition import capacity

        capacity.set_limit(self.org, self.n + 10)
        self._thread.start()
        return self

    def _submit(self) -> None:
        import tasks

        t0 = time.monotonic()
        for i in range(self.n):
            delay = t0 + i * self.spread_s / max(1, self.n) - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            kind = MIX[i % len(MIX)]
            payload = {"i": i, "kind": kind, "tag": self.tag, "mark": str(self.marks / "play"),
                       "step_mark": str(self.marks / "step"),
                       "seconds": 4.0 if kind == "long" else 0.1}
            if kind == "sheet":
                payload.update(rows=rows_for(i), row_s=ROW_S, row_mark=str(self.marks / "row"))
            try:
                run_id = tasks.submit_run(PLAY, input=payload, org_id=self.org).id
            except Exception as exc:  # a refused submit is what a user sees: counted
                self.submit_errors[type(exc).__name__] += 1
                self.refused.append(i)
                continue
            self.ids.append(run_id)
            self.index[run_id] = i
            self.kinds[run_id] = kind

    def join(self) -> None:
        self._thread.join(self.spread_s + 120)
        if self._thread.is_alive():
            raise RuntimeError("a submit_run call hung for two minutes")


def probe_recovery(fault_end: float, timeout: float = 180.0) -> float | None:
    """Seconds from fault_end until a fresh short run succeeds (one probe at a time; a
    refused submit or a failed probe is tried again), or None past the timeout."""
    import tasks

    deadline = fault_end + timeout
    while time.monotonic() < deadline:
        try:
            handle = tasks.submit_run(PLAY, input={"i": -1, "kind": "short", "seconds": 0},
                                      org_id="chaos-probe")
            result = handle.wait(timeout=max(1.0, min(30.0, deadline - time.monotonic())))
            if result.status == "succeeded":
                return time.monotonic() - fault_end
        except Exception:  # noqa: S110 - not yet recovered: try again
            pass
        time.sleep(0.2)
    return None


def db(env: dict[str, str]) -> psycopg.Connection[Any]:
    return psycopg.connect(env["PLAYRUN_DATABASE_URL"].replace("+psycopg", ""),
                           autocommit=True)


def wait_terminal(env: dict[str, str], ids: list[str]) -> None:
    """Until every run is terminal or the last one's deadline has passed (DB clock)."""
    while True:
        with db(env) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE status <> ALL(%s)), extract(epoch FROM "
                "now() - max(created_at)) FROM runs WHERE id = ANY(%s)",
                (list(TERMINAL), ids)).fetchone()
        assert row is not None
        if not row[0] or float(row[1] or 0) > DEADLINE_S:
            return
        time.sleep(0.5)


def leftovers(env: dict[str, str]) -> dict[str, int]:
    """What is still held: capacity slots, resource records, sandboxes on disk."""
    root = Path(env["PLAYRUN_SANDBOX_ROOT"])
    with db(env) as conn:
        leases = conn.execute("SELECT count(*) FROM capacity_leases "
                              "WHERE state <> 'released'").fetchone()
        resources = conn.execute("SELECT count(*) FROM runtime_resources "
                                 "WHERE state <> 'deleted'").fetchone()
    dirs = [p for p in root.iterdir() if not p.name.startswith(".")] if root.is_dir() else []
    control = root / ".control"
    records = list(control.iterdir()) if control.is_dir() else []
    return {"slots": int(leases[0]) if leases else 0,
            "resources": int(resources[0]) if resources else 0,
            "sandboxes": len(dirs) + len(records)}


def settle(env: dict[str, str]) -> dict[str, int]:
    """Leftovers once releases and GC had SETTLE_S to finish."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        left = leftovers(env)
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def check(env: dict[str, str], load: Load) -> dict[str, Any]:
    """The table's figures for one kind (after wait_terminal and settle)."""
    with db(env) as conn:
        rows = conn.execute(
            "SELECT id, status, code, extract(epoch FROM coalesce(finished_at, now()) "
            "- created_at), deferral_count, error FROM runs WHERE id = ANY(%s)",
            (load.ids,)).fetchall()
    marks = Counter((load.marks / "play").read_text().split()) \
        if (load.marks / "play").exists() else Counter()
    steps = Counter((load.marks / "step").read_text().split()) \
        if (load.marks / "step").exists() else Counter()
    statuses: Counter[str] = Counter()
    codes: Counter[str] = Counter()
    unexpected = 0
    samples: list[str] = []  # what a user would read on the first unexpected outcomes
    sheets = check_sheets(load, {r[0]: r[1] for r in rows})
    for rid, status, code, _took, _deferred, error in rows:
        statuses[status] += 1
        if status == "failed":
            codes[code or "?"] += 1
        if status != EXPECTED[load.kinds[rid]]:
            unexpected += 1
            if len(samples) < 5:
                samples.append(f"{rid} ({load.kinds[rid]} #{load.index[rid]}): {status} "
                               f"{code}: {(error or '')[-300:]}")
    return {
        "submitted": len(load.ids),
        "submit_errors": dict(load.submit_errors),
        "succeeded": statuses["succeeded"],
        "failed": dict(codes),
        "unexpected": unexpected,
        "unexpected_sample": samples,
        "lost": sum(1 for r in rows if r[1] not in TERMINAL),
        "doubled": sum(1 for c in marks.values() if c > 1) + sum(1 for c in steps.values()
                                                                  if c > 1),
        "stuck": sum(1 for r in rows if float(r[3]) > DEADLINE_S),
        "executions": sum(marks.values()),
        "deferred": sum(1 for r in rows if r[4]),
        "never_executed": sum(1 for i in load.index.values() if marks[str(i)] == 0),
        # The commit may have happened before the connection died: the caller saw an error
        # for a run that exists (a retry with the same idempotency key finds it).
        "refused_but_ran": sum(1 for i in load.refused if marks[str(i)]),
        **sheets,
    }


def starts_by_worker(stack: Stack, since: float | None = None) -> dict[str, int]:
    """start_attempt deliveries each worker received (from its log, all its lives); with
    `since` (a time.time()), only those logged from then on: does it consume again?"""
    assert stack.workers is not None
    needle = b"Task playrun.start_attempt["
    return {w.name: sum(1 for line in w.log_path.read_bytes().splitlines()
                        if needle in line and line.endswith(b"received")
                        and (since is None or _logged_at(line) >= since))
            for w in stack.workers.workers}


def _logged_at(line: bytes) -> float:
    """A Celery log line's time ("[2026-12-01 16:50:31,432: INFO/..."), local time."""
    try:
        return datetime.strptime(line[1:24].decode(), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return 0.0


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
