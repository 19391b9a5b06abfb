"""Shared set-up for benchmarks: a throwaway PostgreSQL database and Redis db."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import statistics
import subprocess
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import redis

from tasks.host.processes import free_port, pid_alive

# import tasks reads no setting: these are safe before bench_env sets the environment
from tasks.store import redisconn
from tasks.testing import Beat, Child, Gateway, Worker

C = TypeVar("C", bound=Child)

PG_BASE = os.environ.get("BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
REDIS_BASE = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379")


BENCH_DBS = range(12, 16)  # tests claim 1-11
_MARK = "playrun:bench-session"


def claim_redis_db(redis_base: str, preferred: int) -> int:
    """A Redis db no other bench holds: two benches on one db flush and share each other's
    queues (their workers take each other's start messages). `preferred` first, then 12-15."""
    admin = redis.Redis.from_url(f"{redis_base}/0")
    try:
        busy = {int(c.get("db", 0)) for c in admin.client_list()}
    finally:
        admin.close()
    for db in [preferred, *[d for d in BENCH_DBS if d != preferred]]:
        client = redis.Redis.from_url(f"{redis_base}/{db}")
        try:
            holder = client.get(_MARK)
            if holder is not None and pid_alive(int(holder)):
                continue
            if db in busy and holder is None:
                continue  # something else (a stray worker) is connected to it
            client.flushdb()
            if client.set(_MARK, os.getpid(), nx=True, ex=6 * 3600):
                return db
        finally:
            client.close()
    raise RuntimeError(f"no free Redis db among {list(BENCH_DBS)}: another bench holds each")


@contextmanager
def bench_env(
    redis_db: int, *, pg_base: str | None = None, redis_base: str | None = None
) -> Iterator[dict[str, str]]:
    """Create and migrate a database, point PLAYRUN_* at it and a free Redis db (redis_db
    if no other bench holds it); clean up after.
    pg_base / redis_base: another server than BENCH_PG / BENCH_REDIS (a private one)."""
    pg_base, redis_base = pg_base or PG_BASE, redis_base or REDIS_BASE
    redis_db = claim_redis_db(redis_base, redis_db)
    name = f"playrun_bench_{secrets.token_hex(4)}"
    admin = pg_base.replace("+psycopg", "") + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    env = {
        "PLAYRUN_DATABASE_URL": f"{pg_base}/{name}",
        "PLAYRUN_REDIS_URL": f"{redis_base}/{redis_db}",
        "PLAYRUN_SECRET_KEY": "bench-" + secrets.token_hex(24),
        "PLAYRUN_SANDBOX_ROOT": f"/tmp/playrun-bench-{name}",
    }
    os.environ.update(env)
    from tasks.settings import reset_settings
    from tasks.store import db

    reset_settings()
    try:
        db.upgrade(env["PLAYRUN_DATABASE_URL"])
        yield env
    finally:
        db.dispose_engines()
        redisconn.client(env["PLAYRUN_REDIS_URL"]).flushdb()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(env["PLAYRUN_SANDBOX_ROOT"], ignore_errors=True)


def database_name(env: dict[str, str]) -> str:
    return env["PLAYRUN_DATABASE_URL"].rsplit("/", 1)[1]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> str:
    return (
        f"p50 {pct(values, 50) * 1000:8.1f} ms  p99 {pct(values, 99) * 1000:8.1f} ms  "
        f"mean {statistics.mean(values) * 1000:8.1f} ms"
    )


# --- child processes (gateway, workers, runner hosts): tasks.testing's --------------------

ROOT = Path(__file__).resolve().parent.parent


def gateway_env(directory: Path) -> dict[str, str]:
    """A private gateway address: a free TCP port and a socket in our own directory (never
    the shared defaults, where another checkout's gateway may be listening)."""
    return {
        "PLAYRUN_GATEWAY_URL": f"http://127.0.0.1:{free_port()}",
        "PLAYRUN_GATEWAY_SOCKET": str(directory / "gateway-sock" / "gateway.sock"),
    }


def stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so every `finally` stops its children."""

    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def start_child(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> Child:
    """A started subprocess logging to log_dir/NAME.log (run from the checkout's root)."""
    return Child(name, args, env, log_dir / f"{name}.log", cwd=ROOT).start()


def _ready(process: C, timeout: float) -> C:
    try:
        process.start().wait_ready(timeout)
    except BaseException:
        process.stop()
        raise
    return process


def start_gateway(env: dict[str, str], log_dir: Path, name: str = "gateway") -> Gateway:
    return _ready(Gateway(env, log_dir / f"{name}.log", name=name), 60)


def start_worker(
    env: dict[str, str],
    log_dir: Path,
    name: str,
    *,
    concurrency: int = 2,
    beat: bool = False,
    loglevel: str = "INFO",
    extra: tuple[str, ...] = (),
) -> Worker:
    worker = Worker(
        env,
        log_dir / f"{name}.log",
        name=f"{name}@bench",
        concurrency=concurrency,
        beat=beat,
        loglevel=loglevel,
        extra=extra,
    )
    worker.name = name  # what reports call it; its Celery node name stays NAME@bench
    return _ready(worker, 90)


def start_beat(env: dict[str, str], log_dir: Path, name: str = "beat") -> Beat:
    """A standalone `celery -A tasks beat` (a worker's tree then holds only its pool)."""
    return _ready(Beat(env, log_dir / f"{name}.log", name=name), 90)


def tree_pids(pid: int) -> list[int]:
    """pid and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def rss(pid: int) -> int:
    """Resident set size of one process in bytes (VmRSS from /proc); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss(pid: int) -> int:
    """Resident set size in bytes, summed over the process tree."""
    return sum(rss(p) for p in tree_pids(pid))


def _cpu_seconds(pids: Iterable[int | str], keep: Callable[[bytes], bool] | None = None,
                 children: bool = False) -> float:
    """CPU seconds of `pids` whose command line passes `keep`: their own (utime + stime), or
    with `children` what their reaped children used (cutime + cstime)."""
    first = 13 if children else 11
    ticks = 0
    for pid in pids:
        try:
            if keep is not None:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if not keep(f.read()):
                        continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        ticks += int(fields[first]) + int(fields[first + 1])
    return ticks / os.sysconf("SC_CLK_TCK")


def _all_pids() -> list[str]:
    return [entry for entry in os.listdir("/proc") if entry.isdigit()]


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of the tree."""
    return _cpu_seconds(tree_pids(pid))


def cpu_matching(text: str) -> float:
    """CPU seconds used so far by live processes whose command line contains `text`
    (a database's PostgreSQL backends show its name in theirs)."""
    return _cpu_seconds(_all_pids(), lambda cmdline: text.encode() in cmdline)


def pg_backends_cpu(text: str) -> float:
    """cpu_matching(text) plus what exited PostgreSQL backends used: the postmaster reaps
    them, and their time moves into its children's (cutime, cstime). Other databases'
    exited backends count too, so on a busy server take it as an upper bound."""
    def postmaster(cmdline: bytes) -> bool:  # backends retitle themselves; it does not
        return cmdline.split(b"\0", 1)[0].endswith(b"postgres")
    return cpu_matching(text) + _cpu_seconds(_all_pids(), postmaster, children=True)


def xact_commits(datname: str) -> int:
    """pg_stat_database.xact_commit of a database, read from the `postgres` database (so the
    reading itself is not counted)."""
    admin = PG_BASE.replace("+psycopg", "") + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (datname,)
        ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def private_servers(log_dir: Path, pg_options: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """(PostgreSQL base URL, Redis base URL) of servers of our own, stopped after: for counts
    that other users of the shared servers would blur. `pg_options`: `-c name=value` pairs.
    Their logs are log_dir/postgres.log and log_dir/redis.log."""
    postgres = shutil.which("postgres")
    initdb = shutil.which("initdb")
    redis_server = shutil.which("redis-server") or shutil.which("valkey-server")
    if not (postgres and initdb and redis_server):
        raise SystemExit("private servers need postgres, initdb and redis-server on PATH")
    data = log_dir / "pgdata"
    data.mkdir()
    as_user: list[str] = []
    # PostgreSQL refuses to run as root: run it as `postgres`. The uid change clears
    # PR_SET_PDEATHSIG, so only the `finally` below stops it (not a SIGKILLed bench).
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(data, user.pw_uid, user.pw_gid)
        os.chmod(log_dir, 0o755)
        as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups"]
    with open(log_dir / "initdb.log", "wb") as log:
        subprocess.run(
            [*as_user, initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "utf8"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=data,
            check=True,
            timeout=120,
        )
    pg_port, redis_port = free_port(), free_port()
    servers = [
        start_child(
            "postgres",
            [
                *as_user,
                postgres,
                "-D",
                str(data),
                "-p",
                str(pg_port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={data}",
                *pg_options,
            ],
            dict(os.environ),
            log_dir,
        ),
        start_child(
            "redis",
            [
                redis_server,
                "--port",
                str(redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(log_dir),
            ],
            dict(os.environ),
            log_dir,
        ),
    ]
    try:
        servers[0].wait_for("ready to accept connections", timeout=60)
        servers[1].wait_for("Ready to accept connections", timeout=60)
        yield (
            f"postgresql+psycopg://postgres@127.0.0.1:{pg_port}",
            f"redis://127.0.0.1:{redis_port}",
        )
    finally:
        for server in servers:
            server.stop()


def capacity_cycle(fence: Any, org_id: str, settings: Any, sandbox_id: str) -> None:
    """One capacity cycle as a sandbox start and its release make it: reserve, promote,
    release, each one fenced statement and (here, alone) its own autocommit transaction.
    `tasks` is imported here, not at the top: bench_env must set the environment first."""
    from sqlalchemy.orm import Session

    from tasks.acquisition import capacity
    from tasks.release.capacity import release_lease
    from tasks.store.db import autocommit

    with autocommit() as conn, Session(bind=conn) as session:
        lease_id = capacity.reserve(session, fence, org_id, settings).lease_id
        capacity.promote(session, fence, lease_id, "bench", sandbox_id)
    if release_lease(fence.run_id, fence.generation) != [lease_id]:
        raise RuntimeError(f"lease {lease_id} was not released once")
