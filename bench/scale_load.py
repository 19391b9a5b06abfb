"""Bulk fill for bench_scale: ended runs with their whole history, in SQL (generate_series).

Run i (1-based) succeeded a day ago: one ended attempt, one released capacity lease, one
deleted sandbox, one sent outbox row and `events` ledger events. Every table the periodic
jobs read grows with the runs, as it would in production. Ids are either random (md5 of
a tag and i: what uuid4 ids were) or time-ordered (UUIDv7-shaped: the millisecond of a
base time plus i, then md5 digits), as `Ids` says.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg

DIGEST = "0" * 64
ORG_COUNT = 1000
DAY_MS = 86_400_000


@dataclass(frozen=True)
class Ids:
    """How the fill names rows: `ordered` ids start with a millisecond (base_ms + i)."""

    ordered: bool
    base_ms: int = 0

    def expr(self, tag: str, i: str = "i", days_ago: int = 1) -> str:
        """SQL for the id of row `i` of a kind (`tag`): 32 lower-case hex digits."""
        digest = f"md5('{tag}' || {i})"
        if not self.ordered:
            return digest
        ms = self.base_ms - days_ago * DAY_MS
        return (f"(lpad(to_hex({ms}::bigint + {i}), 12, '0') || '7' || substr({digest}, 1, 3)"
                f" || '8' || substr({digest}, 5, 15))")


def ids(ordered: bool) -> Ids:
    return Ids(ordered, time.time_ns() // 1_000_000)


_FILL = [
    """INSERT INTO runs (id, org_id, play_path, play_digest, input, status, current_generation,
                         deferral_count, deferral_total_ms, created_at, updated_at, finished_at)
       SELECT {r}, 'scale-' || (i % {orgs}), 'plays/noop.py', '{digest}', '{{}}',
              'succeeded', 1, 0, 0, now() - interval '{days} day', now() - interval '{days} day',
              now() - interval '{days} day'
       FROM generate_series({lo}, {hi}) AS i""",
    """INSERT INTO attempts (id, run_id, generation, lease_token, lease_expires_at, worker_id,
                             state, provider, sandbox_id, events_offset, end_reason, started_at,
                             ended_at)
       SELECT {a}, {r}, 1, md5('t' || i), now() - interval '{days} day', 'w',
              'ended', 'fake', 'sb-' || i, 0, 'succeeded', now() - interval '{days} day',
              now() - interval '{days} day'
       FROM generate_series({lo}, {hi}) AS i""",
    """INSERT INTO capacity_leases (id, org_id, run_id, generation, state, holder_token,
                                    provider, sandbox_id, overrun, reserved_at, live_at,
                                    released_at)
       SELECT {l}, 'scale-' || (i % {orgs}), {r}, 1, 'released',
              md5('t' || i), 'fake', 'sb-' || i, false, now() - interval '{days} day',
              now() - interval '{days} day', now() - interval '{days} day'
       FROM generate_series({lo}, {hi}) AS i""",
    """INSERT INTO runtime_resources (id, run_id, generation, provider, sandbox_id, labels,
                                      state, holder_token, created_at, updated_at, deleted_at)
       SELECT {s}, {r}, 1, 'fake', '{sb}' || i, '{{}}', 'deleted',
              md5('t' || i), now() - interval '{days} day', now() - interval '{days} day',
              now() - interval '{days} day'
       FROM generate_series({lo}, {hi}) AS i""",
    """INSERT INTO outbox (id, run_id, task_name, args, created_at, available_at, sent_at,
                           publish_count)
       SELECT {o}, {r}, 'playrun.start_attempt',
              jsonb_build_array({r}), now() - interval '{days} day',
              now() - interval '{days} day', now() - interval '{days} day', 1
       FROM generate_series({lo}, {hi}) AS i""",
    """INSERT INTO run_events (run_id, generation, kind, data, at)
       SELECT {r}, 1, 'run.progress', jsonb_build_object('n', n),
              now() - interval '{days} day'
       FROM generate_series({lo}, {hi}) AS i, generate_series(1, {events}) AS n""",
]


def connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(url.replace("+psycopg", ""), autocommit=True)
    # A bulk load, not the workload measured: nothing here needs to wait for the disk.
    conn.execute("SET synchronous_commit = off")
    return conn


def bundle(url: str) -> None:
    with connect(url) as conn:
        conn.execute("INSERT INTO play_bundles (digest, source, size) VALUES (%s, '', 0) "
                     "ON CONFLICT DO NOTHING", (DIGEST,))


def fill(url: str, lo: int, hi: int, events: int, ids: Ids, *, tag: str = "",
         days: int = 1, vacuum: bool = True) -> None:
    """Runs lo..hi (inclusive) and everything they left behind, ended `days` ago."""
    if hi < lo:
        return
    names = {k: ids.expr(tag + k, days_ago=days) for k in "ralso"}
    with connect(url) as conn:
        for sql in _FILL:
            conn.execute(sql.format(lo=lo, hi=hi, events=events, orgs=ORG_COUNT, days=days,
                                    digest=DIGEST, sb=f"sb-{tag}", **names))
        if vacuum:  # as autovacuum would soon after such a load: measure the steady state
            conn.execute("VACUUM ANALYZE")


def run_ids(url: str, ids: Ids, n: int) -> list[str]:
    """The ids of runs 1..n of the fill."""
    with connect(url) as conn:
        return [str(r[0]) for r in conn.execute(
            f"SELECT {ids.expr('r')} FROM generate_series(1, {n}) AS i ORDER BY i")]


def backlog(url: str, queued: int, deferred: int, ids: Ids) -> None:
    """Queued runs with unsent outbox rows: `queued` due now, `deferred` due tomorrow."""
    q, qo = ids.expr("q", days_ago=0), ids.expr("qo", days_ago=0)
    with connect(url) as conn:
        conn.execute(f"""
            INSERT INTO runs (id, org_id, play_path, play_digest, input, status,
                              current_generation, deferral_count, deferral_total_ms)
            SELECT {q}, 'scale-q', 'plays/noop.py', '{DIGEST}', '{{}}', 'queued',
                   0, 0, 0
            FROM generate_series(1, {queued + deferred}) AS i""")
        conn.execute(f"""
            INSERT INTO outbox (id, run_id, task_name, args, available_at, publish_count)
            SELECT {qo}, {q}, 'playrun.start_attempt', jsonb_build_array({q}),
                   CASE WHEN i <= {queued} THEN now() - interval '1 hour'
                        ELSE now() + interval '1 day' END, 0
            FROM generate_series(1, {queued + deferred}) AS i""")
        conn.execute("ANALYZE")


def long_ledger(url: str, events: int) -> str:
    """One run with `events` progress events; returns its id."""
    with connect(url) as conn:
        conn.execute(f"""
            INSERT INTO runs (id, org_id, play_path, play_digest, input, status,
                              current_generation, deferral_count, deferral_total_ms)
            VALUES (md5('long'), 'scale-long', 'plays/noop.py', '{DIGEST}', '{{}}',
                    'succeeded', 1, 0, 0)""")
        conn.execute(f"""
            INSERT INTO run_events (run_id, generation, kind, data)
            SELECT md5('long'), 1, 'run.progress', jsonb_build_object('n', n)
            FROM generate_series(1, {events}) AS n""")
        row = conn.execute("SELECT md5('long')").fetchone()
    assert row is not None
    return str(row[0])


def expired_reservations(url: str, n: int, tag: str, ids: Ids) -> None:
    """n reservations that never went live and are past their expiry (for the reaper)."""
    with connect(url) as conn:
        conn.execute(f"""
            INSERT INTO capacity_leases (id, org_id, run_id, generation, state, holder_token,
                                         overrun, expires_at)
            SELECT {ids.expr('x' + tag)}, 'scale-' || (i % {ORG_COUNT}), {ids.expr('r')}, 1,
                   'reserved', md5('t' || i), false, now() - interval '1 hour'
            FROM generate_series(1, {n}) AS i""")


def admission_pages(url: str, run_ids: list[str], task_ids: list[str]) -> dict[str, float]:
    """Buffers and WAL of writing these runs as admission does (the run, its outbox row,
    one attempt, three ledger events), by EXPLAIN (ANALYZE, BUFFERS, WAL), rolled back:
    pages an insert dirties or reads are what random ids scatter and ordered ids share."""
    total = {"dirtied": 0.0, "read": 0.0, "wal_kb": 0.0}
    statements = [
        f"""INSERT INTO runs (id, org_id, play_path, play_digest, input, status,
                              current_generation, deferral_count, deferral_total_ms)
            SELECT r, 'scale-new', 'plays/noop.py', '{DIGEST}', '{{}}', 'queued', 0, 0, 0
            FROM unnest(%(runs)s::text[]) AS r""",
        """INSERT INTO outbox (id, run_id, task_name, args, publish_count)
           SELECT o, r, 'playrun.start_attempt', jsonb_build_array(r), 0
           FROM unnest(%(tasks)s::text[], %(runs)s::text[]) AS t(o, r)""",
        """INSERT INTO attempts (id, run_id, generation, lease_token, lease_expires_at,
                                 state, events_offset)
           SELECT o, r, 1, 't', now(), 'active', 0
           FROM unnest(%(attempts)s::text[], %(runs)s::text[]) AS t(o, r)""",
        """INSERT INTO run_events (run_id, generation, kind, data)
           SELECT r, 1, 'run.progress', jsonb_build_object('n', n)
           FROM unnest(%(runs)s::text[]) AS r, generate_series(1, 3) AS n""",
    ]
    params = {"runs": run_ids, "tasks": task_ids,
              "attempts": [t.replace("-", "") for t in task_ids]}
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        for sql in statements:
            row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + sql,
                               params).fetchone()
            assert row is not None
            plan = row[0][0]["Plan"]
            total["dirtied"] += plan["Shared Dirtied Blocks"]
            total["read"] += plan["Shared Read Blocks"]
            total["wal_kb"] += plan["WAL Bytes"] / 1024
        conn.rollback()
    return total
