"""What PLAYRUN_DB_PGBOUNCER costs a statement, and what the PgBouncer hop adds, side by
side on one scratch database:

- baseline: psycopg as playrun uses it directly (autocommit, statements prepared after
  5 runs);
- the same statements never prepared (`prepare_threshold=None`, PLAYRUN_DB_PGBOUNCER=true)
  on the direct connection;
- the same, never prepared, through a pgbouncer in transaction pooling mode
  (tests/support/pgbouncer.py, Debian's binary).

Two statements: admission's single INSERT of a run (durable: one fsync) and a point read
of a run with its current attempt (what a status poll sends). Interleaved in rounds; the
ratio is of totals (baseline time / this time: below 1 is slower), the range the spread
of the per-round ratios.

    python bench/bench_pgbouncer.py [-n 2000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import PG_BASE, bench_env, database_name

PLAY = Path(__file__).resolve().parent.parent / "examples" / "plays" / "noop.py"
READ = ("SELECT r.status, a.state, a.lease_expires_at FROM runs r "
        "LEFT JOIN attempts a ON a.run_id = r.id AND a.generation = r.current_generation "
        "WHERE r.id = %(id)s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=2000, help="statements per measurement")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    per_round = max(1, args.n // args.rounds)
    from tests.support.pgbouncer import running

    with bench_env(redis_db=13) as env, running(PG_BASE) as bouncer:
        from tasks.admission import rows as admission_rows
        from tasks.admission.validate import load_play

        play = load_play(PLAY)
        event = admission_rows._dumps(admission_rows._event_data(
            admission_rows.NewRun("bench", None, None, play)))
        direct = env["PLAYRUN_DATABASE_URL"].replace("+psycopg", "")
        pooled = bouncer.url(database_name(env)).replace("+psycopg", "")
        conns = {
            "direct, prepared after 5 (baseline)": psycopg.connect(direct, autocommit=True),
            "direct, never prepared": psycopg.connect(direct, autocommit=True,
                                                      prepare_threshold=None),
            "through pgbouncer, never prepared": psycopg.connect(pooled, autocommit=True,
                                                                 prepare_threshold=None),
        }
        ids: list[str] = []

        def insert(conn: psycopg.Connection[Any]) -> Callable[[int], None]:
            def go(k: int) -> None:
                for i in range(k):
                    run_id = uuid.uuid4().hex
                    conn.execute(admission_rows._PG_ONE[False], {
                        "id": run_id, "org": "bench", "path": play.path,
                        "digest": play.digest, "key": None, "input": f'{{"i": {i}}}',
                        "event": event, "outbox": str(uuid.uuid4()), "handed_off": True,
                        "placement": None,
                        "args": admission_rows._dumps(admission_rows.start_args(run_id, None))})
                    ids.append(run_id)
            return go

        def read(conn: psycopg.Connection[Any]) -> Callable[[int], None]:
            def go(k: int) -> None:
                for i in range(k):
                    conn.execute(READ, {"id": ids[i % len(ids)]}).fetchone()
            return go

        import tasks

        tasks.submit_run(PLAY, input={}, org_id="bench")  # stores the play's bundle row
        for statement, make in (("admission INSERT (durable)", insert),
                                ("point read of a run", read)):
            fns = {name: make(conn) for name, conn in conns.items()}
            for fn in fns.values():
                fn(20)  # connect, warm, and past the prepare threshold
            spent: dict[str, list[float]] = {name: [] for name in fns}
            loads = []
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    t = time.perf_counter()
                    fn(per_round)
                    spent[name].append(time.perf_counter() - t)
                loads.append(os.getloadavg()[0])
            base = "direct, prepared after 5 (baseline)"
            print(f"{statement}: {args.rounds} rounds of {per_round}; load average "
                  f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
            for name in fns:
                each = sorted(b / s for s, b in zip(spent[name], spent[base], strict=True))
                total = sum(spent[base]) / sum(spent[name])
                per = sum(spent[name]) / (per_round * args.rounds) * 1e6
                print(f"  {name:40} {per:8.0f} us  {total:5.2f}  "
                      f"({each[len(each) // 10]:.2f}-{each[-1 - len(each) // 10]:.2f})")
        for conn in conns.values():
            conn.close()


if __name__ == "__main__":
    main()
