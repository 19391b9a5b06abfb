"""Admission throughput, side by side on the same Redis and PostgreSQL (no worker consumes;
we measure the enqueue side):

- tasks.submit_runs (batches of 100) against plain Celery .delay() of a no-op task;
- tasks.submit_run (one run) against a bare single-row INSERT + COMMIT loop on the same
  database: the durable limit, one fsync per row;
- tasks.submit_run with an idempotency key already used (a lookup, nothing written);
- submit_run's one statement alone, sent by psycopg in autocommit (no validation, no
  SQLAlchemy, no publish): the floor of submit_run on this database and disk.

The measurements are interleaved in rounds so that each sees the same machine noise
(the host is shared); the ratios are of totals over all rounds, and the range is the
spread of the per-round ratios.

    python bench/bench_submit.py [-n 1000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import bench_env

PLAY = Path(__file__).resolve().parent.parent / "examples" / "plays" / "noop.py"
BATCH = 100


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=1000, help="runs per measurement")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    per_round = max(BATCH, args.n // args.rounds // BATCH * BATCH)
    with bench_env(redis_db=13) as env:
        import sqlalchemy as sa
        from celery import Celery

        import tasks
        from tasks.store.db import get_engine

        plain = Celery("plain", broker=env["PLAYRUN_REDIS_URL"])

        @plain.task(name="bench.noop")
        def noop() -> None:
            return None

        engine = get_engine()
        with engine.connect() as conn:
            conn.execute(sa.text("CREATE TABLE bare (id bigserial PRIMARY KEY, v text)"))
            conn.commit()
        bare_conn = engine.connect()
        insert = sa.text("INSERT INTO bare (v) VALUES (:v)")
        counter = [0]

        def delay(k: int) -> None:
            for _ in range(k):
                noop.delay()

        def batches(k: int) -> None:
            for _ in range(k // BATCH):
                counter[0] += 1
                tasks.submit_runs([{"play": PLAY, "input": {"i": i}, "org_id": "bench",
                                    "idempotency_key": f"b{counter[0]}-{i}"}
                                   for i in range(BATCH)])

        def bare(k: int) -> None:
            for i in range(k):
                bare_conn.execute(insert, {"v": str(i)})
                bare_conn.commit()

        def single(k: int) -> None:
            for i in range(k):
                counter[0] += 1
                tasks.submit_run(PLAY, input={"i": i}, org_id="bench",
                                 idempotency_key=f"s{counter[0]}")

        import psycopg

        from tasks.admission import rows as admission_rows
        from tasks.admission.validate import load_play

        play = load_play(PLAY)  # its bundle is stored by the warm-up below
        event = admission_rows._dumps(admission_rows._event_data(
            admission_rows.NewRun("bench", None, None, play)))  # the event admission writes
        raw = psycopg.connect(env["PLAYRUN_DATABASE_URL"].replace("+psycopg", ""),
                              autocommit=True)

        def statement(k: int) -> None:
            for i in range(k):
                raw.execute(admission_rows._PG_ONE[False], {
                    "id": uuid.uuid4().hex, "org": "bench", "path": play.path,
                    "digest": play.digest, "key": None, "input": f'{{"i": {i}}}',
                    "event": event, "outbox": str(uuid.uuid4()),
                    "handed_off": True})

        def repeat(k: int) -> None:
            for i in range(k):
                tasks.submit_run(PLAY, input={"i": i}, org_id="bench", idempotency_key="s1")

        what: dict[str, Callable[[int], None]] = {
            "plain Celery noop.delay()": delay, "tasks.submit_runs, per run": batches,
            "bare INSERT + COMMIT": bare, "tasks.submit_run (new run)": single,
            "tasks.submit_run (idempotent repeat)": repeat,
            "its statement alone (psycopg)": statement,
        }
        for fn in what.values():  # connect and warm every path
            fn(BATCH)
        spent: dict[str, list[float]] = {name: [] for name in what}
        loads = []
        for _ in range(args.rounds):
            for name, fn in what.items():
                t = time.perf_counter()
                fn(per_round)
                spent[name].append(time.perf_counter() - t)
            loads.append(os.getloadavg()[0])
        bare_conn.close()
        raw.close()

        def rate(name: str) -> float:
            return per_round * args.rounds / sum(spent[name])

        def ratio(name: str, base: str) -> str:
            each = sorted(b / s for s, b in zip(spent[name], spent[base], strict=True))
            return (f"{rate(name) / rate(base):7.2f}  ({each[len(each) // 10]:.2f}-"
                    f"{each[-1 - len(each) // 10]:.2f})")

        print(f"{args.rounds} rounds of {per_round} runs each; load average "
              f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
        print(f"{'what':40} {'per second':>11}  {'ratio (range)':<24} baseline")
        rows = [("plain Celery noop.delay()", None), ("tasks.submit_runs, per run",
                                                      "plain Celery noop.delay()"),
                ("bare INSERT + COMMIT", None), ("tasks.submit_run (new run)",
                                                 "bare INSERT + COMMIT"),
                ("tasks.submit_run (idempotent repeat)", "bare INSERT + COMMIT"),
                ("its statement alone (psycopg)", "bare INSERT + COMMIT")]
        for name, base in rows:
            text = ratio(name, base) if base else f"{'1.00':>7}"
            print(f"{name:40} {rate(name):11.0f}  {text:<24} {base or '-'}")
        print("targets: submit_runs >= 2.0 x .delay(); submit_run >= 0.6 x bare INSERT")


if __name__ == "__main__":
    main()
