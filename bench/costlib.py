"""Server-side counters for bench/run_cost.py: CPU time of the PostgreSQL cluster's and of
Redis's processes, WAL bytes and pg_stat_statements' execution time.

CPU is read from /proc/<pid>/schedstat (time on a CPU, in ns) of the postmaster and every
process it forked: backends, the WAL writer, the checkpointer. pg_stat_statements' time is
the time inside statements (not parse, commit or the protocol), so it is the smaller of the
two; both are given.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench.common import (
    bench_env,
    database_name,
    gateway_env,
    private_servers,
    start_child,
    start_gateway,
    start_worker,
)


def _on_cpu_ns(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0  # gone between the listing and the read


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its ')'
        out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def _children(parent: int) -> list[int]:
    return [pid for pid, ppid in _parents().items() if ppid == parent]


def tree_ms(roots: list[int]) -> float:
    """On-CPU time (ms) of these processes and all their descendants (a worker's pool)."""
    parents = _parents()
    tree, grew = set(roots), True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(_on_cpu_ns(pid) for pid in tree) / 1e6


class ServerCPU:
    """On-CPU time of the PostgreSQL cluster in `pgdata` and of the Redis server at `redis`
    (ns). Backends that exited take their time with them: the pools keep theirs open."""

    def __init__(self, pgdata: Path, redis: Any) -> None:
        self.postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
        self.redis = redis
        self.processes: dict[str, list[int]] = {}  # name -> root pids, measured as trees

    def pg_ns(self) -> int:
        return sum(_on_cpu_ns(pid) for pid in [self.postmaster, *_children(self.postmaster)])

    def redis_us(self) -> float:
        info = self.redis.info("cpu")
        return (float(info["used_cpu_user"]) + float(info["used_cpu_sys"])) * 1e6

    def redis_calls(self) -> Counter[str]:
        """Calls per command, as Redis counts them (commands run by scripts included)."""
        stats = self.redis.info("commandstats")
        return Counter({name.removeprefix("cmdstat_"): int(v["calls"])
                        for name, v in stats.items()})


PG_STATS_SQL = """
SELECT pg_current_wal_lsn() - '0/0'::pg_lsn,
       (SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements s
        JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %(db)s),
       (SELECT coalesce(sum(total_plan_time), 0) FROM pg_stat_statements s
        JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %(db)s),
       db.xact_commit, db.sessions
FROM pg_stat_database db WHERE db.datname = %(db)s
"""

# Commands that are the measurement's own or an idle consumer's, not a run's.
NOT_A_RUN = ("info", "monitor", "brpop", "ping", "client|setname", "client|list",
             "config|get", "command|docs")


def snapshot(pg: Any, cpu: ServerCPU, datname: str) -> Counter[str]:
    c = _snapshot(pg, cpu, datname)
    for name, roots in cpu.processes.items():
        c[f"{name}.cpu_ms"] = tree_ms(roots)  # type: ignore[assignment]  # ms, not a count
    # This process's main thread submits (its own children are the servers and the rest).
    c["submit.cpu_ms"] = _on_cpu_ns(os.getpid()) / 1e6  # type: ignore[assignment]
    return c


def _snapshot(pg: Any, cpu: ServerCPU, datname: str) -> Counter[str]:
    """Cumulative server counters: WAL bytes, statement time (ms), commits, CPU, Redis."""
    wal, exec_ms, plan_ms, commits, sessions = pg.execute(PG_STATS_SQL, {"db": datname}).fetchone()
    c: Counter[str] = Counter({"pg.wal_bytes": int(wal), "pg.exec_ms": float(exec_ms),
                               "pg.plan_ms": float(plan_ms),
                               "pg.commits": int(commits or 0),
                               "pg.sessions": int(sessions or 0),
                               "pg.cpu_ms": cpu.pg_ns() / 1e6,
                               "redis.cpu_us": cpu.redis_us()})
    calls = cpu.redis_calls()
    c["redis.calls"] = sum(v for k, v in calls.items() if k not in NOT_A_RUN)
    return c


def settled_snapshot(pg: Any, cpu: ServerCPU, datname: str, wait_s: float = 11.0
                     ) -> Counter[str]:
    """`snapshot` once PostgreSQL's cumulative statistics caught up: an idle backend
    flushes its commit counts up to 10 s late."""
    time.sleep(wait_s)  # a fixed wait: the server gives no sign of the flush
    return snapshot(pg, cpu, datname)


def made(root: Path) -> int:
    """Sandboxes the fake provider has made so far (its script's count of creates)."""
    from tasks.sandbox import FakeScript

    return int(FakeScript(root).state()["creates_ok"])


def released(root: Path) -> bool:
    """No sandbox is left: the release deletes the fake provider's `fsb-*` directory."""
    return not any(root.glob("fsb-*"))


LOAD_ROWS = [("commits", "pg.commits"), ("PG CPU ms", "pg.cpu_ms"),
             ("PG statement ms", "pg.exec_ms"), ("PG planning ms", "pg.plan_ms"),
             ("PG connects", "pg.sessions"), ("WAL bytes", "pg.wal_bytes"),
             ("Redis calls", "redis.calls"), ("Redis CPU µs", "redis.cpu_us"),
             ("worker CPU ms", "worker.cpu_ms"), ("gateway CPU ms", "gateway.cpu_ms"),
             ("submit CPU ms", "submit.cpu_ms")]


def load_table(label: str, per_run: Counter[str], n: int, rate: float, elapsed: float) -> str:
    head = "| load | " + " | ".join(name for name, _ in LOAD_ROWS) + " |"
    cells = " | ".join(f"{per_run[key]:,.{2 if per_run[key] < 100 else 0}f}"
                       for _, key in LOAD_ROWS)
    return "\n".join([
        f"{label}: {n} no-op runs submitted one by one at {rate:g}/s, done in {elapsed:.1f} s;"
        " per run, less the same time idle",
        head, "|---" * (len(LOAD_ROWS) + 1) + "|", f"| {rate:g}/s | {cells} |"])


def run_load(submit: Callable[[], None], pg: Any, cpu: ServerCPU, datname: str, root: Path,
             n: int, rate: float) -> tuple[Counter[str], float]:
    """Per-run server costs of `n` runs submitted at `rate` a second, less the same time
    idle (no sandbox left from before). Returns (per run, seconds to the last release)."""
    before = settled_snapshot(pg, cpu, datname)
    first = made(root)
    began = time.monotonic()
    for i in range(n):
        submit()
        lag = began + (i + 1) / rate - time.monotonic()
        if lag > 0:
            time.sleep(lag)  # pacing the submissions, not waiting for an event
    deadline = began + n / rate + 120
    while made(root) - first < n or not released(root):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{made(root) - first} of {n} sandboxes made, not all released")
        time.sleep(0.05)
    elapsed = time.monotonic() - began
    after = settled_snapshot(pg, cpu, datname)
    # The same span idle (the servers' own timers, the processes' polls), taken off.
    span = elapsed + 11.0
    idle = diff(settled_snapshot(pg, cpu, datname, span), after)
    total = diff(after, before)
    return Counter({k: (total[k] - idle[k]) / n for k in total}), elapsed


def diff(after: Counter[str], before: Counter[str]) -> Counter[str]:
    return Counter({k: after[k] - before[k] for k in after.keys() | before.keys()})


TOP_SQL = """
SELECT s.calls, s.total_exec_time, s.plans, s.total_plan_time,
       regexp_replace(left(s.query, 110), '\\s+', ' ', 'g')
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = %(db)s AND s.query NOT LIKE 'CREATE %%'
ORDER BY s.total_exec_time + s.total_plan_time DESC LIMIT 15
"""


def top_statements(pg: Any, datname: str) -> str:
    """The statements that took the most time, over the whole bench (--details)."""
    lines = ["| calls | total ms | mean ms | plans | planning ms | statement |",
             "|---|---|---|---|---|---|"]
    for calls, total, plans, plan_ms, text in pg.execute(TOP_SQL, {"db": datname}).fetchall():
        lines.append(f"| {calls} | {total:.1f} | {total / max(calls, 1):.3f} | {plans} | "
                     f"{plan_ms:.1f} | `{text}` |")
    return "\n".join(lines)


def under_load(n: int, rates: list[float], play: Path, *, details: bool) -> None:
    """`bench/run_cost.py --load`: see its docstring."""
    log_dir = Path(tempfile.mkdtemp(prefix="bench-run-cost-load-"))
    pg_options = ("-c", "shared_preload_libraries=pg_stat_statements", "-c", "autovacuum=off",
                  "-c", "pg_stat_statements.track_utility=on",
                  "-c", "pg_stat_statements.track_planning=on",
                  *os.environ.get("BENCH_PG_EXTRA", "").split())
    with private_servers(log_dir, pg_options) as (pg_base, redis_base), \
            bench_env(redis_db=0, pg_base=pg_base, redis_base=redis_base) as env:
        import tasks
        from tasks.sandbox import FakeScript

        root = Path(env["PLAYRUN_SANDBOX_ROOT"])
        FakeScript(root).set(hosted_runners=True)
        env.update(gateway_env(log_dir))
        env.update({"PLAYRUN_SANDBOX_PROVIDER": "fake", "PLAYRUN_WORKER_WATCHDOG_S": "0",
                    "PLAYRUN_METRICS_DIR": str(log_dir / "metrics"),
                    # The start rate must not pace the load (a start waits in place for
                    # its slot): its bucket is 10,000/s.
                    **{f"PLAYRUN_START_RATE_{k}_PER_MIN": "600000"
                       for k in ("INITIAL", "MAX", "FLOOR")},
                    "PLAYRUN_ORG_CAPACITY": "100000",  # nor the org's capacity fail runs
                    **{f"PLAYRUN_METRICS_{kind}_ADDR": "127.0.0.1:0"
                       for kind in ("WORKER", "BEAT", "GATEWAY")}})
        os.environ.update(env)
        env = {**os.environ, **env}
        pg = psycopg.connect(pg_base.replace("+psycopg", "") + "/postgres", autocommit=True)
        pg.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        cpu = ServerCPU(log_dir / "pgdata", redis.Redis.from_url(env["PLAYRUN_REDIS_URL"]))
        procs = [start_gateway(env, log_dir)]
        try:
            host = start_child("runner-host", [sys.executable, "-m", "tasks.sandbox.fake_runners",
                                               str(root)], env, log_dir)
            procs.append(host)
            host.wait_for("ready")
            workers = [start_worker(env, log_dir, f"cost{i}", extra=("--without-heartbeat",))
                       for i in range(2)]
            procs += workers
            cpu.processes = {"worker": [w.pid for w in workers], "gateway": [procs[0].pid]}
            noop = {"fake": {"seconds": 0.3}}

            def submit() -> None:
                tasks.submit_run(play, input=noop, org_id="bench-cost")

            run_load(submit, pg, cpu, database_name(env), root, 20, 10.0)  # warm
            results = [(rate, *run_load(submit, pg, cpu, database_name(env), root, n,
                                                rate)) for rate in rates]
            top = top_statements(pg, database_name(env)) if details else ""
        finally:
            for p in reversed(procs):
                p.stop()
    for rate, per_run, elapsed in results:
        print(load_table(time.strftime("%Y-%m-%d"), per_run, n, rate, elapsed))
    if top:
        print(top)
