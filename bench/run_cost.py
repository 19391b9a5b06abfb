"""What one no-op run costs in transactions, fsyncs, SQL statements, broker messages and
Redis commands, phase by phase (docs/design.md, "What each run costs").

    python bench/run_cost.py [-k 5] [--details] [--no-heartbeat-minute]
    python bench/run_cost.py --load 300 --rate 10 --rate 40

`--load N` measures instead what runs cost under load, where the gateway's heartbeat
batches and the release batches serve many runs: N no-op runs submitted one at a time at
each `--rate` (runs/s), on servers without the statement log (it costs CPU), two worker
processes; per run: commits (pg_stat_database), PostgreSQL CPU (bench/costlib.py), time
inside statements (pg_stat_statements), WAL bytes, Redis calls (INFO commandstats, scripts'
commands included, BRPOP left out) and Redis CPU, less the same span idle.
`BENCH_PG_EXTRA="-c name=value ..."` adds settings to that server (docs/design.md's trials
of `synchronous_commit` and `plan_cache_mode`); `--details` lists the costliest statements
with their planning.

On servers of its own (exact counts: no other user), a gateway, a fake-runner host and one
worker (`--without-heartbeat`, watchdog off: per-worker traffic, not per-run; no beat) run
no-op runs one at a time. Each phase is made to happen alone by stopping (SIGSTOP) the
process that would start the next: the worker during admission, the runner host during
the launch, the worker again while the runner beats and pushes its terminal (the play
takes BEAT_GAP_S to part the two). A phase ends when its sign is there and the counters
stood still for QUIET_S. Figures are medians over k runs; "heartbeats per minute" is 60 s
of one running play minus 60 s idle.
Counted from: PostgreSQL's statement log (`%x` on a COMMIT tells a transaction that
wrote; `SET LOCAL synchronous_commit = off` before it, or `set_config` turning it off in
an autocommit statement, an async one; `;` is the pool's
ping), the next xid (autocommit statements that wrote), pg_stat_wal.wal_sync and Redis
MONITOR (BRPOP left out: an idle consumer's times out each second, and each delivered
message costs one; commands run inside scripts are counted apart, as lua.*).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import costlib  # noqa: E402
from bench.common import (  # noqa: E402
    Child,
    bench_env,
    database_name,
    gateway_env,
    private_servers,
    start_child,
    start_gateway,
    start_worker,
    stop_on_sigterm,
)

NOOP = ROOT / "examples" / "plays" / "noop.py"
QUIET_S = 1.3
BEAT_GAP_S = 7.5  # the first beat comes after the 5 s interval, the second at 10 s: one
PHASES = ["admission", "claim, acquisition, launch", "a heartbeat (plays over 5 s)",
          "settlement", "release"]
COLUMNS = [("commits", "commits"), ("durable", "durable"), ("async", "async"),
           ("read-only", "read_only"), ("pings", "log.pings"), ("WAL fsyncs", "pg.wal_syncs"),
           ("statements", "log.statements"), ("BEGIN/COMMIT/SET", "log.tx_control"),
           ("queue msgs", "redis.lpush"), ("PUBLISH", "redis.publish"), ("Redis cmds", "redis")]
LOG_PREFIX = "@@%p %x %d@@ "
ID = re.compile(r"[0-9a-f]{8}[0-9a-f-]*|\d+")  # ids and numbers in Redis keys, for --details
NO_KEY = ("evalsha", "multi", "exec", "ping", "time", "script", "client")
LOG_LINE = re.compile(rb"@@(\d+) (\d+) (\S*)@@ LOG:  (?:statement|execute [^:]*):(.*)")


def _whole(first: str, rest: list[bytes]) -> str:
    """A statement's text with its continuation lines (up to the next log line)."""
    more = []
    for line in rest:
        if line.startswith(b"@@"):
            break
        more.append(line.decode(errors="replace").strip())
    return " ".join([first, *more])


def tally(lines: list[bytes], datname: bytes, open_tx: dict[bytes, bool],
          c: Counter[str]) -> None:
    """Count the statement log's `lines` of database `datname` into `c`. `open_tx` (pid ->
    async so far) holds the transactions still open, from one call to the next."""
    for i, line in enumerate(lines):
        m = LOG_LINE.match(line)
        if m is None or m[3] != datname:
            continue  # other databases, DETAIL lines, the rest of a multi-line statement
        pid, wrote, text = m[1], m[2] != b"0", m[4].decode(errors="replace").strip()
        rest = iter(lines[i + 1:])
        while not text:  # a statement that starts with a newline: its first line
            text = next(rest, b"?").decode(errors="replace").strip()
        word = text.split(" ", 1)[0].upper().rstrip(";")
        if text == ";":  # the pool's ping of a connection idle over a second
            c["log.pings"] += 1
            continue
        if word not in ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "SET"):
            c["log.statements"] += 1
            c["log.autocommit"] += pid not in open_tx
            # A one-statement write that turns off its own commit's wait (tasks/store/fence.py);
            # logged before it runs, so with no xid yet (pg.xids counts its write).
            c["log.autocommit_async"] += pid not in open_tx and \
                "set_config('synchronous_commit', 'off'" in _whole(text, lines[i + 1:])
            c["sql: " + text[:100]] += 1
            continue
        c["log.tx_control"] += 1
        if word == "BEGIN":
            open_tx[pid] = False
        elif word == "SET" and "synchronous_commit = off" in text:
            open_tx[pid] = True
        elif word == "ROLLBACK":
            open_tx.pop(pid, None)
            c["log.rollbacks"] += 1
            c["log.rollback_writes"] += wrote
        elif word == "COMMIT":
            is_async = open_tx.pop(pid, False)
            c["log.commits"] += 1
            c["log.async" if is_async and wrote else "log.durable_explicit" if wrote
              else "log.read_only_explicit"] += 1


class RedisMonitor(threading.Thread):
    """Counts the commands Redis runs (MONITOR): by clients, and by scripts apart."""

    def __init__(self, url: str) -> None:
        super().__init__(name="redis-monitor", daemon=True)
        self.monitor = redis.Redis.from_url(url).monitor().__enter__()  # type: ignore[no-untyped-call]
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def run(self) -> None:
        with contextlib.suppress(redis.ConnectionError):
            while True:  # b'1700000000.123 [0 127.0.0.1:5555] "HSET" "key" ...' ("[0 lua]")
                head, _, command = self.monitor.connection.read_response().partition(b"] ")
                words = command.decode(errors="replace").split('"')
                name = words[1].lower()
                if name == "brpop":  # an idle consumer's BRPOP times out every second
                    continue
                key = ID.sub("*", words[3]) if len(words) > 3 and name not in NO_KEY else ""
                with self.lock:
                    self.counts[("lua." if head.endswith(b" lua") else "redis.") + name] += 1
                    self.counts[f"key: {name} {key}"[:80]] += 1

    def read(self) -> Counter[str]:
        with self.lock:
            return Counter(self.counts)


class Counters:
    """Snapshots of the servers' counters, read from outside the measured database."""

    def __init__(self, pg_base: str, redis_url: str, datname: str, pg_log: Path) -> None:
        self.pg = psycopg.connect(pg_base.replace("+psycopg", "") + "/postgres", autocommit=True)
        self.pg.execute("SET log_statement = 'none'")  # our own reads stay out of the log
        self.redis = RedisMonitor(redis_url)
        self.redis.start()
        self.datname = datname.encode()
        self.log = open(pg_log, "rb")  # noqa: SIM115 - read for the life of the process
        self.log.seek(0, os.SEEK_END)
        self.logged: Counter[str] = Counter()
        self.open: dict[bytes, bool] = {}  # pid -> in a transaction, async so far

    def _read_log(self) -> None:
        """Count the statements logged since the last read, cumulatively."""
        lines = self.log.read().split(b"\n")
        self.log.seek(-len(lines[-1]), os.SEEK_CUR)  # a line still being written: later
        tally(lines[:-1], self.datname, self.open, self.logged)

    def read(self, *, stats: bool = True) -> Counter[str]:
        """The counters; `stats=False` leaves out PostgreSQL's cumulative statistics, which
        are flushed up to a second late, and 10 s late when a flush meets our read's lock."""
        row = self.pg.execute(  # xmax moves once per write transaction, run one at a time
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint" + (
                ", (SELECT xact_commit FROM pg_stat_database WHERE datname = %(db)s),"
                " (SELECT wal_sync FROM pg_stat_wal)" if stats else ""),
            {"db": self.datname.decode()} if stats else None).fetchone()
        c = Counter(dict(zip(("pg.xids", "pg.commits", "pg.wal_syncs"), row or (), strict=False)))
        self._read_log()
        c.update(self.logged)
        c.update(self.redis.read())
        return c

    def settle(self, sign: Callable[[], bool], what: str, timeout: float = 60) -> Counter[str]:
        """Once `sign()` holds, the counters after they stood still for QUIET_S."""
        deadline = time.monotonic() + timeout
        while not sign():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no sign of {what} after {timeout:g}s")
            time.sleep(0.05)
        last, since = self.read(stats=False), time.monotonic()
        while time.monotonic() - since < QUIET_S:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: the counters did not stand still")
            time.sleep(0.1)
            now = self.read(stats=False)
            if now != last:
                last, since = now, time.monotonic()
        return self.read()


def derive(delta: Counter[str]) -> Counter[str]:
    """Adds the columns computed from the raw counters."""
    d = Counter(delta)
    explicit_writes = d["log.durable_explicit"] + d["log.async"] + d["log.rollback_writes"]
    autocommit_writes = d["pg.xids"] - explicit_writes
    d["durable"] = d["log.durable_explicit"] + autocommit_writes - d["log.autocommit_async"]
    d["async"] = d["log.async"] + d["log.autocommit_async"]
    d["read_only"] = d["log.read_only_explicit"] + d["log.autocommit"] - autocommit_writes
    d["commits"] = d["log.commits"] + d["log.autocommit"] + d["log.pings"]
    d["redis"] = sum(v for k, v in d.items() if k.startswith("redis."))
    return d


def diff(after: Counter[str], before: Counter[str]) -> Counter[str]:
    return Counter({k: after[k] - before[k] for k in after.keys() | before.keys()
                    if after[k] != before[k]})


def one_run(counters: Counters, worker: Child, host: Child, root: Path,
            org: str) -> list[Counter[str]]:
    """The five phases of one no-op run, each alone (module docstring)."""
    import tasks

    spool = root / ".fake-runs"
    worker.kill(signal.SIGSTOP)
    marks = [counters.read()]
    tasks.submit_run(NOOP, input={"fake": {"seconds": BEAT_GAP_S}}, org_id=org)
    marks.append(counters.settle(lambda: True, "admission"))
    worker.kill(signal.SIGCONT)
    marks.append(counters.settle(lambda: any(spool.glob("*.json")), "the launch"))
    sandbox = root / next(spool.glob("*.json")).stem
    worker.kill(signal.SIGSTOP)
    host.kill(signal.SIGCONT)
    statements = marks[-1]["log.statements"]
    marks.append(counters.settle(  # the beat's statements are logged at once
        lambda: counters.read(stats=False)["log.statements"] > statements, "the first beat"))
    if (sandbox / ".fake-exit.json").exists():
        raise RuntimeError("the play ended before its first beat stood still: raise BEAT_GAP_S")
    marks.append(counters.settle(lambda: (sandbox / ".fake-exit.json").exists(), "the terminal"))
    host.kill(signal.SIGSTOP)
    worker.kill(signal.SIGCONT)
    marks.append(counters.settle(lambda: not sandbox.exists(), "the release"))
    return [derive(diff(b, a)) for a, b in zip(marks, marks[1:], strict=False)]


def heartbeat_minute(counters: Counters, worker: Child, host: Child, root: Path,
                     org: str) -> Counter[str]:
    """60 s of one play running minus 60 s idle, the worker stopped in both: a running play
    does not need it, and its own periodic calls would blur the figure."""
    import tasks

    host.kill(signal.SIGCONT)  # idle, it only scans its spool directory
    worker.kill(signal.SIGSTOP)
    idle0 = counters.settle(lambda: True, "quiet")
    time.sleep(60)  # a fixed measuring window, not a wait for an event
    idle = diff(counters.read(), idle0)
    worker.kill(signal.SIGCONT)
    tasks.submit_run(NOOP, input={"fake": {"seconds": 75}}, org_id=org)
    counters.settle(lambda: any(root.glob("fsb-*/.fake-hosted")), "the launch")  # handed over
    sandbox = next(root.glob("fsb-*/.fake-hosted")).parent
    counters.settle(lambda: not (root / ".fake-runs" / f"{sandbox.name}.json").exists(),
                    "the runner's start")
    worker.kill(signal.SIGSTOP)
    busy0 = counters.read()
    time.sleep(60)
    busy = diff(counters.read(), busy0)
    worker.kill(signal.SIGCONT)
    assert not (sandbox / ".fake-exit.json").exists(), "the play ended inside the window"
    counters.settle(lambda: not sandbox.exists(), "the end of the long play", timeout=120)
    host.kill(signal.SIGSTOP)
    return derive(diff(busy, idle))


def table(rows: list[tuple[str, Counter[str]]]) -> str:
    head = f"| phase | {' | '.join(name for name, _ in COLUMNS)} |"
    lines = [head, "|---" * (len(COLUMNS) + 1) + "|"]
    for phase, c in rows:
        cells = " | ".join("·" if c[key] is None else f"{round(c[key], 1):g}"
                           for _, key in COLUMNS)
        lines.append(f"| {phase} | {cells} |")
    return "\n".join(lines)


def median(runs: list[Counter[str]]) -> Counter[str]:
    keys = set().union(*runs)
    return Counter({k: statistics.median(r[k] for r in runs) for k in keys})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", type=int, default=5, help="measured runs (after 3 warm ones)")
    parser.add_argument("--details", action="store_true", help="statements, Redis commands")
    parser.add_argument("--no-heartbeat-minute", action="store_true")
    parser.add_argument("--load", type=int, default=0, metavar="N", help="runs per load")
    parser.add_argument("--rate", type=float, action="append", help="runs/s (repeatable)")
    args = parser.parse_args()
    stop_on_sigterm()
    if args.load:
        costlib.under_load(args.load, args.rate or [10.0], NOOP, details=args.details)
        return
    log_dir = Path(tempfile.mkdtemp(prefix="bench-run-cost-"))
    pg_options = ("-c", "log_statement=all", "-c", f"log_line_prefix={LOG_PREFIX}",
                  "-c", "autovacuum=off")
    with private_servers(log_dir, pg_options) as (pg_base, redis_base), \
            bench_env(redis_db=0, pg_base=pg_base, redis_base=redis_base) as env:
        from tasks.sandbox import FakeScript

        root = Path(env["PLAYRUN_SANDBOX_ROOT"])
        FakeScript(root).set(hosted_runners=True)
        env.update(gateway_env(log_dir))
        env.update({"PLAYRUN_SANDBOX_PROVIDER": "fake", "PLAYRUN_WORKER_WATCHDOG_S": "0",
                    "PLAYRUN_METRICS_DIR": str(log_dir / "metrics"),
                    **{f"PLAYRUN_METRICS_{kind}_ADDR": "127.0.0.1:0"
                       for kind in ("WORKER", "BEAT", "GATEWAY")}})
        os.environ.update(env)
        env = {**os.environ, **env}
        counters = Counters(pg_base, env["PLAYRUN_REDIS_URL"], database_name(env),
                            log_dir / "postgres.log")
        procs = [start_gateway(env, log_dir)]
        try:
            host = start_child("runner-host", [sys.executable, "-m", "tasks.sandbox.fake_runners",
                                         str(root)], env, log_dir)
            procs.append(host)
            host.wait_for("ready")
            host.kill(signal.SIGSTOP)
            worker = start_worker(env, log_dir, "cost", extra=("--without-heartbeat",))
            procs.append(worker)
            for _ in range(3):  # warm: connections, imports, script loads
                one_run(counters, worker, host, root, "bench-cost")
            runs = [one_run(counters, worker, host, root, "bench-cost") for _ in range(args.k)]
            beats = None if args.no_heartbeat_minute else \
                heartbeat_minute(counters, worker, host, root, "bench-cost")
        finally:
            for p in (*procs[1:], procs[0]):
                p.kill(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            for p in reversed(procs):
                p.stop()
    rows = [(phase, median([r[i] for r in runs])) for i, phase in enumerate(PHASES)]
    total: Counter[str] = Counter()
    for _, c in rows:
        c["pg.wal_syncs"] = None  # type: ignore[assignment]  # the WAL writer reports late
        total.update({k: v for k, v in c.items() if v is not None})
    # Over whole runs the late reports even out: the mean per run, not a sum of medians.
    total["pg.wal_syncs"] = statistics.mean(  # type: ignore[assignment]
        sum(p["pg.wal_syncs"] for p in r) for r in runs)
    rows.append(("one run, total", total))
    if beats is not None:
        rows.append(("heartbeats, per minute running", beats))
    print(f"one no-op run, {args.k} runs, median per phase; {time.strftime('%Y-%m-%d')}")
    print(table(rows))
    every = [p for r in runs for p in r]
    print(f"check: {sum(p['commits'] for p in every)} commits in the statement log, "
          f"{sum(p['pg.commits'] for p in every)} in pg_stat_database (it reports late); "
          f"{sum(p['log.rollbacks'] for p in every)} rollbacks")
    if args.details:
        for phase, c in rows:
            print(f"\n{phase}:")
            for key in sorted(k for k in c if k.startswith(("sql: ", "key: ", "lua.")) and c[k]):
                print(f"  {c[key]:5g}  {key}")


if __name__ == "__main__":
    main()
