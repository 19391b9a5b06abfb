"""One fault kind end to end: its servers, a fresh database, a stack, warm-up, the load
with the fault injected a third of the way in, recovery, and the invariants."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bench_recovery import delete_sandboxes
from bench.chaoslib.faults import Fault
from bench.chaoslib.harness import (
    STACK_SETTINGS,
    Load,
    Stack,
    check,
    db,
    load_average,
    probe_recovery,
    settle,
    starts_by_worker,
    wait_terminal,
)
from bench.common import bench_env, gateway_env


@dataclass
class Plan:
    n: int = 30
    spread_s: float = 15.0  # submissions spread evenly over this
    fault_s: float = 6.0  # how long a fault with a duration lasts
    keep_logs: bool = False


class Skipped(Exception):
    pass


def run_kind(fault: Fault, plan: Plan) -> dict[str, Any]:
    reason = fault.skip_reason()
    if reason:
        return {"skipped": reason}
    log_dir = Path(tempfile.mkdtemp(prefix="chaos-"))
    os.chmod(log_dir, 0o755)
    marks = log_dir / "marks"
    marks.mkdir()
    os.chmod(marks, 0o777)  # plays append here, whatever user a sandbox runs as
    ok = False
    try:
        result = _run(fault, plan, log_dir, marks)
        ok = True
        return result
    except Skipped as exc:
        ok = True
        return {"skipped": str(exc)}
    finally:
        if ok and not plan.keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            print(f"{fault.name}: logs kept in {log_dir}")


def sheets_in_flight(env: dict[str, str], load: Load, start: float, end: float) -> int:
    """Sheet runs admitted before the fault ended and finished after it began: the runs
    whose rows a fault can have hit (the host's clock is the database's here)."""
    ids = [rid for rid, kind in load.kinds.items() if kind == "sheet"]
    with db(env) as conn:
        row = conn.execute(
            "SELECT count(*) FROM runs WHERE id = ANY(%s) AND created_at <= to_timestamp(%s) "
            "AND coalesce(finished_at, now()) >= to_timestamp(%s)", (ids, end, start)).fetchone()
    return int(row[0]) if row else 0


def _run(fault: Fault, plan: Plan, log_dir: Path, marks: Path) -> dict[str, Any]:
    with ExitStack() as es:
        try:
            setup = fault.setup(es, log_dir)
        except RuntimeError as exc:
            raise Skipped(str(exc)) from exc
        env = es.enter_context(bench_env(setup.redis_db, pg_base=setup.pg_base,
                                         redis_base=setup.redis_base))
        try:
            fault.prepare(es, env)
        except RuntimeError as exc:
            raise Skipped(str(exc)) from exc
        stack_env = {**os.environ, **env, **STACK_SETTINGS, **gateway_env(log_dir),
                     **fault.stack_urls()}
        es.callback(delete_sandboxes, Path(env["PLAYRUN_SANDBOX_ROOT"]))
        stack = Stack(stack_env, log_dir)
        es.callback(stack.stop)
        stack.start()
        fault.after_start(stack, stack_env)
        if probe_recovery(time.monotonic(), timeout=120) is None:
            raise RuntimeError(f"{fault.name}: the stack never ran a first play")
        baseline = probe_recovery(time.monotonic(), timeout=60)  # a probe with no fault
        loads = [os.getloadavg()[0]]
        load = Load(plan.n, plan.spread_s, marks).start()
        time.sleep(plan.spread_s / 3)
        start_wall = time.time()
        fault_end = fault.inject(stack, plan.fault_s)
        end_wall = None if fault_end is None else time.time() - (time.monotonic() - fault_end)
        recovery = probe_recovery(fault_end) if fault_end is not None else None
        load.join()
        wait_terminal(env, load.ids)
        loads.append(os.getloadavg()[0])
        left = settle(env)
        starts = starts_by_worker(stack)
        after = starts_by_worker(stack, since=end_wall) if end_wall is not None else None
        # A fault with no end (a skewed clock) is on for every run.
        during = sheets_in_flight(env, load, start_wall if end_wall else 0.0,
                                  end_wall or time.time())
        return {**check(env, load), **left, "recovery_s": recovery, "baseline_s": baseline,
                "sheet_during_fault": during,
                "starts_by_worker": starts, "starts_after_fault": after,
                "no_fault_end": fault_end is None, "load": max(loads),
                "loadavg": load_average()}
