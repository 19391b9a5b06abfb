"""What the dashboard costs the hot path and what its pages cost the database.

    python bench/bench_dashboard.py --redis redis://127.0.0.1:6379/14 [--pg URL] [-n 3000]

(1) The bucket's acquire followed by the per-minute start-rate sample (what
    permits.acquire does before it paces) against the bare acquire, interleaved one for
    one on the same Redis; p50/p99 in us and the ratio.
(2) With --pg (a scratch database it creates, fills and drops): one page of
    `list_runs` (50 newest, all orgs / one org / one status) over 200,000 runs, first
    page and a page deep in the keyset, against a bare `SELECT id ... LIMIT 50`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable

import psycopg


def _us(fn: Callable[[], object], n: int, base: Callable[[], object]) -> tuple[list[float],
                                                                            list[float]]:
    mine, theirs = [], []
    for _ in range(n):
        t = time.perf_counter()
        base()
        theirs.append((time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        fn()
        mine.append((time.perf_counter() - t) * 1e6)
    return mine, theirs


def _p(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100)[int(q) - 1]


def bench_acquire(n: int) -> None:
    from tasks.acquisition import permits, starthistory
    from tasks.acquisition.startrate import rules_for
    from tasks.settings import get_settings

    settings = get_settings().model_copy(update={
        "start_rate_initial_per_min": 1_000_000.0, "start_rate_max_per_min": 1_000_000.0})
    bucket = f"bench-{uuid.uuid4().hex[:6]}"
    plain_bucket = bucket + "-plain"

    rules = rules_for(settings, bucket, None)
    lim = permits.limiter()

    # What permits.acquire does before it paces: the bucket's decision, then the sample.
    def with_sample() -> object:
        permit = lim.acquire(bucket, rules, observed_successes=1)
        starthistory.record_permit(bucket, permit)
        return permit

    def without() -> object:
        return lim.acquire(plain_bucket, rules, observed_successes=1)

    for _ in range(200):  # warm both paths (scripts loaded, pools connected)
        with_sample()
        without()
    writes = starthistory.writer().writes
    mine, base = _us(with_sample, n, without)
    print(f"sample writes: {starthistory.writer().writes - writes} round trips for {n} "
          f"decisions")
    print(f"acquire without sample: p50 {_p(base, 50):.0f} us, p99 {_p(base, 99):.0f} us")
    print(f"acquire with sample:    p50 {_p(mine, 50):.0f} us, p99 {_p(mine, 99):.0f} us")
    print(f"ratio (without / with, p50): {_p(base, 50) / _p(mine, 50):.2f}")


def bench_pages(pg: str, rows: int, n: int) -> None:
    from tasks.settings import reset_settings
    from tasks.store import db

    name = f"playrun_bench_dash_{uuid.uuid4().hex[:6]}"
    admin = pg.replace("+psycopg", "")
    with psycopg.connect(admin + "/postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = f"{pg}/{name}"
    try:
        os.environ["PLAYRUN_DATABASE_URL"] = url
        reset_settings()
        db.upgrade(url)
        with psycopg.connect(f"{admin}/{name}", autocommit=True) as c:
            c.execute("INSERT INTO play_bundles (digest, source, size) VALUES ('d', 'x', 1)")
            c.execute(
                "INSERT INTO runs (id, org_id, play_path, play_digest, status, "
                "current_generation, deferral_count, deferral_total_ms, trouble_count, "
                "created_at, updated_at) SELECT md5(i::text), 'org-' || (i % 100), 'p.py', "
                "'d', (ARRAY['succeeded','failed','queued'])[1 + i % 3], 0, 0, 0, 0, "
                "now() - make_interval(secs => i / 10.0), now() "
                f"FROM generate_series(1, {rows}) i")
            c.execute("ANALYZE runs")
        import tasks

        deep = tasks.list_runs(10_000)[-1]
        cases: dict[str, Callable[[], object]] = {
            "all orgs, first page": lambda: tasks.list_runs(50),
            "one org, first page": lambda: tasks.list_runs(50, "org-7"),
            "status failed, first page": lambda: tasks.list_runs(50, status="failed"),
            "all orgs, page 200 (keyset)": lambda: tasks.list_runs(
                50, before=tasks.run_cursor(deep)),
        }
        with psycopg.connect(f"{admin}/{name}") as c:
            def bare() -> object:
                return c.execute("SELECT id FROM runs LIMIT 50").fetchall()

            for what, fn in cases.items():
                mine, base = _us(fn, n, bare)
                print(f"{what:28s} p50 {_p(mine, 50) / 1000:6.2f} ms  bare SELECT "
                      f"{_p(base, 50) / 1000:5.2f} ms  ratio {_p(base, 50) / _p(mine, 50):.2f}")
    finally:
        db.dispose_engines()
        with psycopg.connect(admin + "/postgres", autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--pg", default=None, help="postgresql+psycopg://user@host:port")
    parser.add_argument("-n", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    os.environ["PLAYRUN_REDIS_URL"] = args.redis
    print(f"load average {os.getloadavg()[0]:.2f}")
    bench_acquire(args.n)
    if args.pg:
        bench_pages(args.pg, args.rows, max(args.n // 10, 50))
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
