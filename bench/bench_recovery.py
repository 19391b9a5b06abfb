"""Recovery cost: wall time of N short runs while workers are SIGKILLed and restarted,
against the same N runs without kills (and a check that none is lost or run twice).

    python bench/bench_recovery.py [-n 150] [--kills 10] [--play-s 1] [--kill-mode group]

The stack is real: a `playrun gateway`, a separate `celery -A tasks beat` (as in
docker-compose.yml; never killed), two `celery -A tasks worker --concurrency=2`, the
local sandbox provider (a real runner process per run), PostgreSQL and Redis; with
PLAYRUN_LEASE_SECONDS=5, PLAYRUN_REAP_INTERVAL_S=1, PLAYRUN_SWEEP_INTERVAL_S=1 and the
start-rate bucket opened up (pacing is not what is measured).

First N runs of bench/plays/nap.py (logs, naps --play-s, returns its index) without kills:
wall time W0, first submit to last terminal by the database clock. Then N more with
--kills SIGKILLs spread evenly over W0, alternating between the two workers; each killed
worker is started again at once, as a supervisor would (a worker still starting is not
killed again before it is ready). --kill-mode: `group` kills the worker's whole process
group (main process and pool children: a container or machine dying), `child` one busy
pool child (the main process forks a replacement; nothing is restarted).

Checked per run: status and output, terminal events in the ledger (exactly one), how
many attempts it took, how often its runner was launched, and how many times the play
really executed (each execution appends a line to a file on the host, outside any fence).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import (  # noqa: E402
    Child,
    bench_env,
    gateway_env,
    start_beat,
    start_gateway,
    start_worker,
    stop_on_sigterm,
)

PLAY = ROOT / "bench" / "plays" / "nap.py"
TERMINAL = ("succeeded", "failed", "cancelled")


class Workers:
    """Two workers under a make-believe supervisor: a killed one is started again."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir = env, log_dir
        self.workers = [start_worker(env, log_dir, f"w{i}", concurrency=2) for i in range(2)]
        self.restarts = [0, 0]

    def ready(self, i: int) -> bool:
        w = self.workers[i]
        return b"ready." in w.since_start()  # this life's log: the new process

    def wait_ready(self, i: int, timeout: float = 120.0) -> None:
        self.workers[i].wait_ready(timeout)

    def busy_child(self, i: int) -> int | None:
        """A pool child of worker i that is running a task (else any pool child)."""
        out = subprocess.run(["pgrep", "-P", str(self.workers[i].pid)], capture_output=True,
                             text=True)
        kids = [int(p) for p in out.stdout.split()]
        for pid in kids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat[stat.rindex(b")") + 2:][:1] == b"R":
                return pid
        return kids[0] if kids else None

    def kill(self, i: int, mode: str) -> None:
        w = self.workers[i]
        if mode == "child":
            pid = self.busy_child(i)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            return  # the worker's main process forks a replacement itself
        w.stop(signal.SIGKILL)  # the whole group: main process and pool children
        w.start()  # the supervisor restarts it at once
        self.restarts[i] += 1

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


def submit(n: int, org: str, seconds: float, mark: Path) -> list[str]:
    import tasks

    return [tasks.submit_run(PLAY, input={"i": i, "seconds": seconds, "mark": str(mark)},
                             org_id=org).id for i in range(n)]


def terminal_count(conn: psycopg.Connection[Any], ids: list[str]) -> int:
    row = conn.execute("SELECT count(*) FROM runs WHERE id = ANY(%s) AND status = ANY(%s)",
                       (ids, list(TERMINAL))).fetchone()
    return int(row[0]) if row else 0


def phase(conn: psycopg.Connection[Any], workers: Workers, n: int, seconds: float,
          mark: Path, kills: list[float], mode: str, timeout: float) -> dict[str, Any]:
    org = f"bench-rec-{uuid.uuid4().hex[:6]}"
    from tasks.acquisition import capacity

    capacity.set_limit(org, n + 10)
    t0 = time.monotonic()
    # App code submits on its own thread: the kills keep to their schedule meanwhile.
    with ThreadPoolExecutor(1) as pool:
        submitting = pool.submit(submit, n, org, seconds, mark)
        done_kills: list[float] = []
        pending = sorted(kills)
        target = 0
        while True:
            now = time.monotonic() - t0
            if pending and now >= pending[0] and (mode == "child" or workers.ready(target)):
                workers.kill(target, mode)
                done_kills.append(now)
                pending.pop(0)
                target = 1 - target
            if submitting.done() and terminal_count(conn, submitting.result()) >= n:
                break
            if now > timeout:
                break
            time.sleep(0.05)
        ids = submitting.result()
    wall_clock = time.monotonic() - t0
    # Kills not yet made when the runs were done are not made (reported as such).
    return {"ids": ids, "wall_clock": wall_clock, "kills_at": done_kills,
            "kills_skipped": len(pending), **check(conn, ids, mark)}


def check(conn: psycopg.Connection[Any], ids: list[str], mark: Path) -> dict[str, Any]:
    rows = conn.execute(
        "SELECT r.id, r.status, r.code, r.output, r.current_generation, "
        "(SELECT count(*) FROM run_events e WHERE e.run_id = r.id "
        " AND e.kind IN ('run.succeeded', 'run.failed', 'run.cancelled')), "
        "(SELECT count(*) FROM attempts a WHERE a.run_id = r.id "
        " AND a.runner_started_at IS NOT NULL), "
        "(SELECT count(*) FROM run_events e WHERE e.run_id = r.id AND e.kind = 'run.progress' "
        " AND e.data->>'message' = 'ran'), "
        "(SELECT count(*) FROM run_events e WHERE e.run_id = r.id AND e.kind = 'run.deferred'), "
        "r.input->>'i' "
        "FROM runs r WHERE r.id = ANY(%s)", (ids,)).fetchall()
    span = conn.execute("SELECT extract(epoch FROM max(finished_at) - min(created_at)) "
                        "FROM runs WHERE id = ANY(%s)", (ids,)).fetchone()
    marks: dict[str, int] = {}
    if mark.exists():
        for line in mark.read_text().split():
            marks[line] = marks.get(line, 0) + 1
    index = {str(r[9]) for r in rows}
    statuses: dict[str, int] = {}
    codes: dict[str, int] = {}
    for r in rows:
        statuses[r[1]] = statuses.get(r[1], 0) + 1
        if r[2]:
            codes[r[2]] = codes.get(r[2], 0) + 1
    picked = conn.execute(
        "(SELECT r.id, extract(epoch FROM r.finished_at - r.created_at), 'slowest' FROM runs r "
        " WHERE r.id = ANY(%s) ORDER BY r.finished_at - r.created_at DESC NULLS FIRST LIMIT 2) "
        "UNION ALL (SELECT r.id, extract(epoch FROM r.finished_at - r.created_at), 'not "
        "succeeded' FROM runs r WHERE r.id = ANY(%s) AND r.status <> 'succeeded' LIMIT 3)",
        (ids, ids)).fetchall()
    timelines = []
    for run_id, took, why in picked:
        events = conn.execute(
            "SELECT e.kind, extract(epoch FROM e.at - r.created_at), e.data FROM run_events e "
            "JOIN runs r ON r.id = e.run_id WHERE e.run_id = %s ORDER BY e.id",
            (run_id,)).fetchall()
        timelines.append((run_id, took, why, [(k, float(t), d) for k, t, d in events]))
    return {
        "timelines": timelines,
        "wall_db": float(span[0]) if span and span[0] is not None else float("nan"),
        "statuses": statuses,
        "codes": codes,
        "outputs_ok": sum(1 for r in rows if r[1] == "succeeded" and r[3] == {"i": int(r[9])}),
        "terminal_not_one": sum(1 for r in rows if r[5] != 1),
        "multi_attempt": sum(1 for r in rows if r[4] > 1),
        "relaunched": sum(1 for r in rows if r[6] > 1),
        "progress_not_one": sum(1 for r in rows if r[7] != 1),
        "deferred": sum(1 for r in rows if r[8] > 0),
        "executed_twice": sum(1 for i in index if marks.get(i, 0) > 1),
        "never_executed": sum(1 for i in index if marks.get(i, 0) == 0),
        "marks_seen": bool(marks),
    }


def delete_sandboxes(root: Path) -> None:
    """Whatever a killed worker's releases left behind (and its runner processes)."""
    from tasks.constants import LABEL_MANAGED
    from tasks.sandbox import get_provider

    provider = get_provider("local", root)
    for ref in provider.list({LABEL_MANAGED: "1"}):
        try:
            provider.delete(ref.sandbox_id)
        except Exception as exc:
            print(f"could not delete sandbox {ref.sandbox_id}: {exc}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=150)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--play-s", type=float, default=1.0)
    parser.add_argument("--kill-mode", choices=("group", "child"), default="group")
    parser.add_argument("--timeout", type=float, default=300.0, help="per phase")
    parser.add_argument("--isolation", choices=("process", "strict"), default="process",
                        help="strict sandboxes cannot write the host file that counts "
                             "executions, so that check shows n/a")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--timelines", action="store_true",
                        help="also print the ledger of the two slowest runs with kills "
                             "(runs that did not succeed are always shown)")
    args = parser.parse_args()
    stop_on_sigterm()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    os.chmod(log_dir, 0o755)
    failed = True
    results: dict[str, dict[str, Any]] = {}
    with bench_env(redis_db=13) as env:
        env.update(gateway_env(log_dir))
        env.update({
            "PLAYRUN_SANDBOX_PROVIDER": "local",
            "PLAYRUN_SANDBOX_ISOLATION": args.isolation,
            "PLAYRUN_START_RATE_INITIAL_PER_MIN": "60000",
            "PLAYRUN_START_RATE_MAX_PER_MIN": "60000",
            "PLAYRUN_LEASE_SECONDS": "5",
            "PLAYRUN_REAP_INTERVAL_S": "1",
            "PLAYRUN_SWEEP_INTERVAL_S": "1",
            "PLAYRUN_HEARTBEAT_INTERVAL_S": "1",
            "PLAYRUN_HEARTBEAT_TIMEOUT_S": "4",
            "PLAYRUN_RUN_TIMEOUT_S": "60",
            "PLAYRUN_GC_GRACE_S": "5",
        })
        env = {**os.environ, **env}
        root = Path(env["PLAYRUN_SANDBOX_ROOT"])
        conn = psycopg.connect(env["PLAYRUN_DATABASE_URL"].replace("+psycopg", ""),
                               autocommit=True)
        children: list[Child] = []
        workers: Workers | None = None
        try:
            children.append(start_gateway(env, log_dir))
            children.append(start_beat(env, log_dir))
            workers = Workers(env, log_dir)
            import tasks

            warm = [tasks.submit_run(PLAY, input={"i": -1, "seconds": 0}, org_id="warm")
                    for _ in range(4)]
            assert all(tasks.RunHandle(h.id).wait(timeout=60).status == "succeeded"
                       for h in warm)

            results["no kills"] = phase(conn, workers, args.n, args.play_s,
                                        log_dir / "marks-0", [], args.kill_mode, args.timeout)
            base = results["no kills"]["wall_db"]
            time.sleep(2)
            kills = [base * (k + 0.5) / args.kills for k in range(args.kills)]
            results[f"{args.kills} kills"] = phase(conn, workers, args.n, args.play_s,
                                                   log_dir / "marks-1", kills, args.kill_mode,
                                                   args.timeout)
            results[f"{args.kills} kills"]["restarts"] = sum(workers.restarts)
            failed = False
        finally:
            conn.close()
            if workers is not None:
                workers.stop()
            for child in reversed(children):
                child.stop()
            delete_sandboxes(root)
            if failed:
                print(f"logs kept in {log_dir}", file=sys.stderr)
    if not failed and not args.keep_logs:
        shutil.rmtree(log_dir, ignore_errors=True)
    report(args, results)
    if args.keep_logs:
        print(f"logs in {log_dir}")


def report(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> None:
    print(f"{args.n} runs of a {args.play_s:g} s play, 2 workers x 2 slots + beat, local "
          f"sandboxes ({args.isolation} isolation), lease 5 s, reaper every 1 s; kill mode "
          f"`{args.kill_mode}`; "
          "2 shared cores")
    names = list(results)
    print(f"{'':34}" + "".join(f"{n:>24}" for n in names))

    def row(label: str, fn: Any) -> None:
        print(f"{label:34}" + "".join(f"{fn(results[n]):>24}" for n in names))

    row("wall time, s (DB clock)", lambda r: f"{r['wall_db']:.1f}")
    row("kills made (skipped)", lambda r: f"{len(r['kills_at'])} ({r['kills_skipped']})")
    row("statuses", lambda r: " ".join(f"{k}:{v}" for k, v in sorted(r["statuses"].items())))
    row("failure codes", lambda r: " ".join(f"{k}:{v}" for k, v in r["codes"].items()) or "-")
    row("right output", lambda r: f"{r['outputs_ok']}/{args.n}")
    row("terminal events != 1", lambda r: f"{r['terminal_not_one']}")
    row("runs with > 1 attempt", lambda r: f"{r['multi_attempt']}")
    row("runs deferred (pre-code retry)", lambda r: f"{r['deferred']}")
    row("runner launched > 1 time", lambda r: f"{r['relaunched']}")
    row("play executed twice (host file)", lambda r: f"{r['executed_twice']}"
        if r["marks_seen"] else "n/a")
    row("play never executed", lambda r: f"{r['never_executed']}" if r["marks_seen"] else "n/a")
    row("'ran' progress events != 1", lambda r: f"{r['progress_not_one']}")
    shown = [(name, t) for name in names for t in results[name]["timelines"]
             if t[2] != "slowest" or (args.timelines and name == names[1])]
    for name, (run_id, took, why, events) in shown:
        print(f"{why} ({name}): run {run_id} took {float(took or 'nan'):.1f} s")
        for kind, at, data in events:
            detail = {k: v for k, v in (data or {}).items()
                      if k in ("cause", "delay_ms", "generation", "reason", "detail",
                               "code", "error", "by")}
            print(f"  {at:6.2f} s  {kind:20} {detail if detail else ''}")
    a, b = results[names[0]]["wall_db"], results[names[1]]["wall_db"]
    print(f"ratio (kills / no kills): {b / a:.2f}x   kills at "
          + ", ".join(f"{t:.1f}" for t in results[names[1]]["kills_at"]) + " s")


if __name__ == "__main__":
    main()
