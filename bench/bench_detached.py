"""Detached runs one worker keeps alive: N concurrent plays on a worker with two slots.

    python bench/bench_detached.py [-n 300] [--min-s 60] [--max-s 90] [--window 25]

About 3 minutes with the defaults on two shared cores; `-n 1000` takes about 6 (starting
1,000 runs through two worker slots is most of it).

The stack is real: a `playrun gateway`, one `celery -A tasks worker --concurrency=2 --beat`,
PostgreSQL and Redis; the sandbox provider is `fake` with hosted runners, so one runner host
process (`python -m tasks.sandbox.fake_runners`) plays every sandbox's runner as a coroutine
speaking the real protocol (heartbeat every PLAYRUN_HEARTBEAT_INTERVAL_S, default 5 s;
`complete` at the end). A calibration batch measures how fast the worker starts runs; then
each load run is told to run until a random 60-90 s after the expected last start (runs
that start earlier run longer), so all N overlap and the window sees no starts or ends.

Measured, side by side idle and with the N runs going:
  - how many run at once, and the time from the first submit until all N are launched;
  - the start latency of one new run (submit committed -> launch recorded, by the database
    clock), on the idle system and while N are running;
  - RSS of the worker (its process tree: main, two pool children, beat), the gateway and the
    runner host (which stands in for N sandboxes), summed from /proc;
  - database commits per second (pg_stat_database.xact_commit over a window, read from
    another database so the reading is not counted) per running play; lease writes per
    second per running play (pg_stat_user_tables.n_tup_upd on attempts);
  - then (unless --no-drain) that all N succeed, each with exactly one terminal event, and
    how late each terminal is after its runner's planned end.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
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
    database_name,
    gateway_env,
    pct,
    start_child,
    start_gateway,
    start_worker,
    stop_on_sigterm,
    tree_cpu,
    tree_rss,
    xact_commits,
)

NOOP = ROOT / "examples" / "plays" / "noop.py"
MB = 1024 * 1024


class Db:
    """Autocommit reads of the bench database (each statement is one transaction)."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url.replace("+psycopg", ""), autocommit=True)
        self.statements = 0

    def one(self, sql: str, params: Any = None) -> Any:
        self.statements += 1
        row = self.conn.execute(sql, params).fetchone()
        return row[0] if row is not None and len(row) == 1 else row

    def all(self, sql: str, params: Any = None) -> list[Any]:
        self.statements += 1
        return list(self.conn.execute(sql, params).fetchall())

    def launched_running(self, org: str, tag: str) -> int:
        return int(self.one(
            "SELECT count(*) FROM runs r JOIN attempts a ON a.run_id = r.id "
            "AND a.generation = r.current_generation WHERE r.org_id = %s AND r.status = "
            "'running' AND a.runner_started_at IS NOT NULL AND r.input->'fake'->>'tag' = %s",
            (org, tag)))

    def launched(self, org: str, tag: str) -> int:
        return int(self.one(
            "SELECT count(DISTINCT r.id) FROM runs r JOIN attempts a ON a.run_id = r.id "
            "WHERE r.org_id = %s AND a.runner_started_at IS NOT NULL "
            "AND r.input->'fake'->>'tag' = %s", (org, tag)))

    def attempt_updates(self) -> int:
        return int(self.one("SELECT n_tup_upd FROM pg_stat_user_tables "
                            "WHERE relname = 'attempts'"))


def start_latency(db: Db, org: str, count: int) -> list[float]:
    """Submit `count` short runs one at a time; seconds from submit committed to launch
    recorded, by the database clock."""
    import tasks

    out = []
    for _ in range(count):
        handle = tasks.submit_run(NOOP, input={"fake": {"seconds": 1, "tag": "probe"}},
                                  org_id=org)
        out.append(start_latency_wait(db, handle.id))
    return out


def start_latency_wait(db: Db, run_id: str, timeout: float = 120.0) -> float:
    """Seconds from submit to launch recorded; inf if not launched within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        seconds = db.one(
            "SELECT extract(epoch FROM a.runner_started_at - r.created_at) FROM runs r "
            "JOIN attempts a ON a.run_id = r.id WHERE r.id = %s "
            "AND a.runner_started_at IS NOT NULL", (run_id,))
        if seconds is not None:
            return float(seconds)
        if time.monotonic() > deadline:
            return float("inf")
        time.sleep(0.01)


def beat_latency(env: dict[str, str], db: Db, run_id: str, count: int) -> list[float]:
    """Heartbeats for one running play, sent the way a runner sends them (runner_client:
    a new connection over the gateway's Unix socket per request), `count` of them 0.1 s apart."""
    from tasks.execution.runner_client import Gateway
    from tasks.security import tokens

    org, generation, launch_id = db.one(
        "SELECT r.org_id, a.generation, a.launch_id FROM runs r JOIN attempts a ON "
        "a.run_id = r.id AND a.generation = r.current_generation WHERE r.id = %s", (run_id,))
    token = tokens.mint(org_id=org, run_id=run_id, generation=generation, launch_id=launch_id,
                        capabilities=(tokens.RUN_HEARTBEAT,), ttl_s=600,
                        secret=env["PLAYRUN_SECRET_KEY"])
    gateway = Gateway(env["PLAYRUN_GATEWAY_URL"], env["PLAYRUN_GATEWAY_SOCKET"])
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        gateway.call(token, {"action": "heartbeat"})
        out.append(time.perf_counter() - t0)
        time.sleep(0.1)
    return out


def calibrate(db: Db, org: str, count: int) -> float:
    """Launches per second of a batch of short runs submitted at once."""
    import tasks

    handles = [tasks.submit_run(NOOP, input={"fake": {"seconds": 0.5, "tag": "calibrate"}},
                                org_id=org) for _ in range(count)]
    for h in handles:
        assert h.wait(timeout=120).status == "succeeded"
    span = float(db.one(
        "SELECT extract(epoch FROM max(a.runner_started_at) - min(r.created_at)) FROM runs r "
        "JOIN attempts a ON a.run_id = r.id WHERE r.id = ANY(%s)", ([h.id for h in handles],)))
    return count / span


def window(db: Db, datname: str, org: str, tag: str, seconds: float,
           procs: dict[str, Child]) -> dict[str, float]:
    """Commits and lease writes per second over `seconds`, and RSS along the way."""
    running0 = db.launched_running(org, tag)
    upd0 = db.attempt_updates()
    own0 = db.statements
    c0, t0 = xact_commits(datname), time.monotonic()
    rss: dict[str, list[int]] = {name: [] for name in procs}
    cpu0 = {name: tree_cpu(child.pid) for name, child in procs.items()}
    while time.monotonic() - t0 < seconds:
        for name, child in procs.items():
            rss[name].append(tree_rss(child.pid))
        time.sleep(min(2.5, max(seconds - (time.monotonic() - t0), 0.01)))
    c1, t1 = xact_commits(datname), time.monotonic()
    cpu1 = {name: tree_cpu(child.pid) for name, child in procs.items()}
    own = db.statements - own0 + 1  # the reads in between (the updates read is one of them)
    upd1 = db.attempt_updates()
    running1 = db.launched_running(org, tag)
    span = t1 - t0
    running = (running0 + running1) / 2
    commits = max(c1 - c0 - own, 0) / span
    out = {"running0": running0, "running1": running1, "span": span, "commits_s": commits,
           "commits_per_play": commits / running if running else float("nan"),
           "lease_writes_per_play": (upd1 - upd0) / span / running if running else float("nan")}
    for name, values in rss.items():
        out[f"rss_{name}"] = max(values) / MB
        out[f"cpu_{name}"] = (cpu1[name] - cpu0[name]) / span  # cores busy
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=300, help="concurrent detached runs")
    parser.add_argument("--min-s", type=float, default=60.0, help="shortest run, seconds")
    parser.add_argument("--max-s", type=float, default=90.0, help="longest run, seconds")
    parser.add_argument("--window", type=float, default=25.0,
                        help="seconds of the commit/RSS window with N running")
    parser.add_argument("--idle-window", type=float, default=10.0)
    parser.add_argument("--probes", type=int, default=5, help="new runs timed idle and loaded")
    parser.add_argument("--calibrate", type=int, default=40,
                        help="short runs that measure the start rate first")
    parser.add_argument("--safety", type=float, default=2.0,
                        help="margin on the expected time to start all N")
    parser.add_argument("--submitters", type=int, default=4, help="app-code threads")
    parser.add_argument("--beats", type=int, default=40, help="heartbeats timed idle and loaded")
    parser.add_argument("--heartbeat-s", type=float, default=5.0)
    parser.add_argument("--no-drain", action="store_true",
                        help="stop once measured instead of waiting for all N to finish")
    args = parser.parse_args()
    stop_on_sigterm()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-detached-"))
    rng = random.Random(7)
    org = f"bench-{uuid.uuid4().hex[:6]}"
    tag = "load"
    report: dict[str, Any] = {}
    failed = True
    with bench_env(redis_db=15) as env:
        import tasks
        from tasks.acquisition import capacity
        from tasks.sandbox import FakeScript

        root = Path(env["PLAYRUN_SANDBOX_ROOT"])
        FakeScript(root).set(hosted_runners=True)
        env.update(gateway_env(log_dir))
        env.update({
            "PLAYRUN_SANDBOX_PROVIDER": "fake",
            # Pacing is not what is measured here (the default is 60 starts/min).
            "PLAYRUN_START_RATE_INITIAL_PER_MIN": "60000",
            "PLAYRUN_START_RATE_MAX_PER_MIN": "60000",
            "PLAYRUN_HEARTBEAT_INTERVAL_S": f"{args.heartbeat_s:g}",
            "PLAYRUN_RUN_TIMEOUT_S": f"{args.max_s + 300:g}",
        })
        env = {**os.environ, **env}
        capacity.set_limit(org, args.n + args.probes * 2 + 20)
        datname = database_name(env)
        db = Db(env["PLAYRUN_DATABASE_URL"])
        procs: dict[str, Child] = {}
        try:
            procs["gateway"] = start_gateway(env, log_dir)
            procs["runner host"] = start_child("runner-host", [sys.executable, "-m",
                                         "tasks.sandbox.fake_runners", str(root)], env, log_dir)
            procs["runner host"].wait_for("ready")
            procs["worker"] = start_worker(env, log_dir, "detached", concurrency=2, beat=True)
            order = ["worker", "gateway", "runner host"]
            procs = {k: procs[k] for k in order}

            warm = [tasks.submit_run(NOOP, input={"fake": {"seconds": 0.2, "tag": "warm"}},
                                     org_id=org) for _ in range(4)]
            assert all(h.wait(timeout=60).status == "succeeded" for h in warm)
            # A play that runs throughout: its heartbeats are timed idle and under load.
            pulse = tasks.submit_run(NOOP, input={"fake": {"hang": True, "tag": "pulse"}},
                                     org_id=org)
            if start_latency_wait(db, pulse.id) == float("inf"):
                raise RuntimeError("the pulse run never launched")
            report["idle"] = window(db, datname, org, tag, args.idle_window, procs)
            report["idle_beat"] = beat_latency(env, db, pulse.id, args.beats)
            report["idle_probe"] = start_latency(db, org, args.probes)
            rate = calibrate(db, org, args.calibrate)
            report["calibrated_rate"] = rate
            time.sleep(1.5)  # the probes and the calibration runs end

            # Runs start in submit order at about `rate` a second; each one runs until
            # min_s..max_s after the expected last start, so all N overlap for a while.
            lead = [(args.n - i) / rate * args.safety for i in range(args.n)]
            durations = [lead[i] + rng.uniform(args.min_s, args.max_s) for i in range(args.n)]
            t_submit = time.monotonic()
            with ThreadPoolExecutor(args.submitters) as pool:  # app code on several threads
                handles = list(pool.map(lambda d: tasks.submit_run(
                    NOOP, input={"fake": {"seconds": round(d, 2), "tag": tag}}, org_id=org),
                    durations))
            report["submit_s"] = time.monotonic() - t_submit
            peak_running, peak_rss = 0, dict.fromkeys(procs, 0)
            deadline = t_submit + args.min_s + 600
            while True:
                launched = db.launched(org, tag)
                peak_running = max(peak_running, db.launched_running(org, tag))
                for name, child in procs.items():
                    peak_rss[name] = max(peak_rss[name], tree_rss(child.pid))
                if launched >= args.n:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {launched} of {args.n} launched")
                time.sleep(0.5)
            report["all_started_wall_s"] = time.monotonic() - t_submit
            report["all_started_db_s"] = float(db.one(
                "SELECT extract(epoch FROM max(a.runner_started_at) - min(r.created_at)) "
                "FROM runs r JOIN attempts a ON a.run_id = r.id WHERE r.org_id = %s "
                "AND r.input->'fake'->>'tag' = %s", (org, tag)))

            report["stages"] = start_stages(db, org, tag)
            report["loaded"] = window(db, datname, org, tag, args.window, procs)
            peak_running = max(peak_running, int(report["loaded"]["running0"]),
                               int(report["loaded"]["running1"]))
            report["loaded_probe_running"] = db.launched_running(org, tag)
            report["loaded_probe"] = start_latency(db, org, args.probes)
            report["loaded_beat"] = beat_latency(env, db, pulse.id, args.beats)
            report["peak_running"] = peak_running
            report["peak_rss"] = {k: v / MB for k, v in peak_rss.items()}

            if not args.no_drain:
                left = max(durations) + 300
                end = time.monotonic() + left
                ids = [h.id for h in handles]
                while True:
                    done = int(db.one("SELECT count(*) FROM runs WHERE id = ANY(%s) AND "
                                      "status IN ('succeeded', 'failed', 'cancelled')", (ids,)))
                    for name, child in procs.items():
                        peak_rss[name] = max(peak_rss[name], tree_rss(child.pid))
                    if done >= args.n or time.monotonic() > end:
                        break
                    time.sleep(1.0)
                report["peak_rss"] = {k: v / MB for k, v in peak_rss.items()}
                report["drain"] = drain_report(db, ids)
            failed = False
        finally:
            db.conn.close()
            for child in reversed(list(procs.values())):
                child.stop()
            if failed:
                print(f"logs kept in {log_dir}", file=sys.stderr)
    if not failed:
        shutil.rmtree(log_dir, ignore_errors=True)
    print_report(args, report)


STAGES = (("submitted -> attempt opened", "run.admitted", "attempt.started"),
          ("attempt opened -> sandbox requested", "attempt.started", "sandbox.requested"),
          ("sandbox requested -> live", "sandbox.requested", "sandbox.live"),
          ("sandbox live -> launch recorded", "sandbox.live", None))


def start_stages(db: Db, org: str, tag: str) -> dict[str, Any]:
    """Where the start of the load runs went: p50/p99 per stage, from the ledger."""
    out: dict[str, Any] = {}
    for label, a, b in STAGES:
        end = ("(SELECT min(x.at) FROM run_events x WHERE x.run_id = r.id AND x.kind = "
               f"'{b}')" if b else "(SELECT min(t.runner_started_at) FROM attempts t "
               "WHERE t.run_id = r.id)")
        rows = db.all(
            f"SELECT extract(epoch FROM {end} - (SELECT min(x.at) FROM run_events x "
            f"WHERE x.run_id = r.id AND x.kind = '{a}')) FROM runs r WHERE r.org_id = %s "
            "AND r.input->'fake'->>'tag' = %s", (org, tag))
        values = [float(v[0]) for v in rows if v[0] is not None]
        out[label] = (pct(values, 50), pct(values, 99)) if values else (float("nan"),) * 2
    # Every publish of a start: the first, plus the sweep's re-publishes of runs still queued.
    published = db.one(
        "SELECT coalesce(sum(o.publish_count), 0), coalesce(max(o.publish_count), 0) "
        "FROM outbox o JOIN runs r ON r.id = o.run_id WHERE r.org_id = %s "
        "AND r.input->'fake'->>'tag' = %s", (org, tag))
    out["published"] = (int(published[0]), int(published[1]))
    # Launches per 20 s since the first submit: the worker's start rate as more run.
    out["timeline"] = [(int(b), int(c)) for b, c in db.all(
        "WITH t0 AS (SELECT min(created_at) AS t FROM runs WHERE org_id = %s "
        "AND input->'fake'->>'tag' = %s) "
        "SELECT floor(extract(epoch FROM a.runner_started_at - t0.t) / 20) AS b, count(*) "
        "FROM runs r JOIN attempts a ON a.run_id = r.id, t0 WHERE r.org_id = %s "
        "AND r.input->'fake'->>'tag' = %s AND a.runner_started_at IS NOT NULL "
        "GROUP BY b ORDER BY b", (org, tag, org, tag))]
    out["deferred"] = int(db.one(
        "SELECT count(*) FROM run_events e JOIN runs r ON r.id = e.run_id WHERE "
        "e.kind = 'run.deferred' AND r.org_id = %s AND r.input->'fake'->>'tag' = %s",
        (org, tag)))
    return out


def drain_report(db: Db, ids: list[str]) -> dict[str, Any]:
    rows = db.all(
        "SELECT r.status, "
        "(SELECT count(*) FROM run_events e WHERE e.run_id = r.id AND e.kind IN "
        "('run.succeeded', 'run.failed', 'run.cancelled')), "
        "(SELECT count(*) FROM attempts a WHERE a.run_id = r.id "
        " AND a.runner_started_at IS NOT NULL), "
        "extract(epoch FROM r.finished_at - a.runner_started_at) "
        "  - (r.input->'fake'->>'seconds')::float "
        "FROM runs r JOIN attempts a ON a.run_id = r.id AND a.generation = r.current_generation "
        "WHERE r.id = ANY(%s)", (ids,))
    statuses: dict[str, int] = {}
    for status, *_ in rows:
        statuses[status] = statuses.get(status, 0) + 1
    lags = [float(r[3]) for r in rows if r[3] is not None]
    return {
        "statuses": statuses,
        "one_terminal": sum(1 for r in rows if r[1] == 1),
        "bad_terminal": sum(1 for r in rows if r[1] != 1),
        "relaunched": sum(1 for r in rows if r[2] > 1),
        "lag_p50": pct(lags, 50) if lags else float("nan"),
        "lag_p99": pct(lags, 99) if lags else float("nan"),
    }


def print_report(args: argparse.Namespace, r: dict[str, Any]) -> None:
    idle, loaded = r["idle"], r["loaded"]
    n = args.n
    ms = 1000
    print(f"{n} detached runs, each until {args.min_s:g}-{args.max_s:g} s after the expected "
          f"last start (calibrated {r['calibrated_rate']:.1f} starts/s x {args.safety:g}), "
          "on one worker "
          f"(--concurrency=2, --beat), fake provider with hosted runners, heartbeat every "
          f"{args.heartbeat_s:g} s; 2 shared cores")
    print(f"{'':44} {'idle':>14} {f'{n} running':>14}")

    def row(label: str, a: str, b: str) -> None:
        print(f"{label:44} {a:>14} {b:>14}")

    row("runs running at once (peak)", "", f"{r['peak_running']}")
    row(f"submit all (app code, {args.submitters} threads), s", "", f"{r['submit_s']:.1f}")
    row("first submit -> all launched, s", "", f"{r['all_started_db_s']:.1f}")
    ip, lp = r["idle_probe"], r["loaded_probe"]
    row("new run start latency p50, ms", f"{pct(ip, 50) * ms:.0f}", f"{pct(lp, 50) * ms:.0f}")
    row("new run start latency max, ms", f"{max(ip) * ms:.0f}", f"{max(lp) * ms:.0f}")
    ib, lb = r["idle_beat"], r["loaded_beat"]
    row("heartbeat round trip p50, ms", f"{pct(ib, 50) * ms:.1f}", f"{pct(lb, 50) * ms:.1f}")
    row("heartbeat round trip p99, ms", f"{pct(ib, 99) * ms:.1f}", f"{pct(lb, 99) * ms:.1f}")
    for name in ("worker", "gateway", "runner host"):
        row(f"RSS {name} (process tree), MB", f"{idle[f'rss_{name}']:.0f}",
            f"{loaded[f'rss_{name}']:.0f} (peak {r['peak_rss'][name]:.0f})")
    for name in ("worker", "gateway", "runner host"):
        row(f"CPU {name}, % of one core", f"{idle[f'cpu_{name}'] * 100:.0f}",
            f"{loaded[f'cpu_{name}'] * 100:.0f}")
    row("plays running during the window", f"{idle['running0']:.0f}",
        f"{loaded['running0']:.0f}-{loaded['running1']:.0f}")
    row("DB commits/s (xact_commit)", f"{idle['commits_s']:.1f}", f"{loaded['commits_s']:.1f}")
    row("DB commits/s per running play", "", f"{loaded['commits_per_play']:.3f}")
    row("lease writes/s per running play", "", f"{loaded['lease_writes_per_play']:.3f}")
    print(f"windows: idle {idle['span']:.0f} s, loaded {loaded['span']:.0f} s; "
          f"probes: {args.probes} runs submitted one at a time, the loaded ones with "
          f"{r['loaded_probe_running']} running")
    stages = r["stages"]
    print(f"starting the {n}: p50 / p99 s per stage; {stages['deferred']} deferrals")
    for label, *_ in STAGES:
        p50, p99 = stages[label]
        print(f"  {label:40} {p50:8.2f} {p99:8.2f}")
    published, most = stages["published"]
    print(f"start_attempt publishes for the {n}: {published} ({published / n:.2f} per run, "
          f"at most {most} for one run; the sweep re-publishes runs still queued)")
    launched, line = 0, []
    for bucket, count in stages["timeline"]:
        launched += count
        line.append(f"{bucket * 20}-{bucket * 20 + 20}s: {count / 20:.1f}/s ({launched})")
    print("launch rate per 20 s since the first submit (launched so far):")
    for k in range(0, len(line), 4):
        print("  " + "   ".join(line[k:k + 4]))
    drain = r.get("drain")
    if drain:
        print(f"drain: statuses {drain['statuses']}; exactly one terminal event: "
              f"{drain['one_terminal']}/{n}; launched more than once: {drain['relaunched']}; "
              f"terminal after the runner's planned end p50 {drain['lag_p50']:.2f} s, "
              f"p99 {drain['lag_p99']:.2f} s")


if __name__ == "__main__":
    main()
