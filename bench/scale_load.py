"""Bulk fill for bench_scale: ended runs with their whole history, in SQL (generate_series).

Run i (1-based) has id md5('r' || i): succeeded a day ago, one ended attempt, one released
capacity lease, one deleted sandbox, one sent outbox row and `events` ledger events. Every
table the periodic jobs read grows with the runs, as it would in production.
"""

from __future__ import annotations

import psycopg

DIGEST = "0" * 64
ORG_COUNT = 1000

_FILL = [
    """INSERT INTO runs (id, org_id, play_path, play_digest, input, status, current_generation,
                         deferral_count, deferral_total_ms, created_at, updated_at, finished_at)
       SELECT md5('r' || i), 'scale-' || (i % {orgs}), 'plays/noop.py', '{digest}', '{{}}',
              'succeeded', 1, 0, 0, now() - interval '1 day', now() - interval '1 day',
              now() - interval '1 day'
       FROM generate_series({lo}, {hi}) AS i""",
    """INSERT INTO attempts (id, run_id, generation, lease_token, lease_expires_at, worker_id,
                             state, provider, sandbox_id, events_offset, end_reason, started_at,
                             ended_at)
       SELECT md5('a' || i), md5('r' || i), 1, md5('t' || i), now() - interval '1 day', 'w',
              'ended', 'fake', 'sb-' || i, 0, 'succeeded', now() - interval '1 day',
              now() - interval '1 day'
       FROM generate_series({lo}, {hi}) AS i""",
    """INSERT INTO capacity_leases (id, org_id, run_id, generation, state, holder_token,
                                    provider, sandbox_id, overrun, reserved_at, live_at,
                                    released_at)
       SELECT md5('l' || i), 'scale-' || (i % {orgs}), md5('r' || i), 1, 'released',
              md5('t' || i), 'fake', 'sb-' || i, false, now() - interval '1 day',
              now() - interval '1 day', now() - interval '1 day'
       FROM generate_series({lo}, {hi}) AS i""",
    """INSERT INTO runtime_resources (id, run_id, generation, provider, sandbox_id, labels,
                                      state, holder_token, created_at, updated_at, deleted_at)
       SELECT md5('s' || i), md5('r' || i), 1, 'fake', 'sb-' || i, '{{}}', 'deleted',
              md5('t' || i), now() - interval '1 day', now() - interval '1 day',
              now() - interval '1 day'
       FROM generate_series({lo}, {hi}) AS i""",
    """INSERT INTO outbox (id, run_id, task_name, args, created_at, available_at, sent_at,
                           publish_count)
       SELECT md5('o' || i), md5('r' || i), 'playrun.start_attempt',
              jsonb_build_array(md5('r' || i)), now() - interval '1 day',
              now() - interval '1 day', now() - interval '1 day', 1
       FROM generate_series({lo}, {hi}) AS i""",
    """INSERT INTO run_events (run_id, generation, kind, data, at)
       SELECT md5('r' || i), 1, 'run.progress', jsonb_build_object('n', n),
              now() - interval '1 day'
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


def fill(url: str, lo: int, hi: int, events: int) -> None:
    """Runs lo..hi (inclusive) and everything they left behind."""
    if hi < lo:
        return
    with connect(url) as conn:
        for sql in _FILL:
            conn.execute(sql.format(lo=lo, hi=hi, events=events, orgs=ORG_COUNT,
                                    digest=DIGEST))
        # As autovacuum would soon after such a load: measure the steady state, not it.
        conn.execute("VACUUM ANALYZE")


def backlog(url: str, queued: int, deferred: int) -> None:
    """Queued runs with unsent outbox rows: `queued` due now, `deferred` due tomorrow."""
    with connect(url) as conn:
        conn.execute(f"""
            INSERT INTO runs (id, org_id, play_path, play_digest, input, status,
                              current_generation, deferral_count, deferral_total_ms)
            SELECT md5('q' || i), 'scale-q', 'plays/noop.py', '{DIGEST}', '{{}}', 'queued',
                   0, 0, 0
            FROM generate_series(1, {queued + deferred}) AS i""")
        conn.execute(f"""
            INSERT INTO outbox (id, run_id, task_name, args, available_at, publish_count)
            SELECT md5('qo' || i), md5('q' || i), 'playrun.start_attempt',
                   jsonb_build_array(md5('q' || i)),
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


def expired_reservations(url: str, n: int, tag: str) -> None:
    """n reservations that never went live and are past their expiry (for the reaper)."""
    with connect(url) as conn:
        conn.execute(f"""
            INSERT INTO capacity_leases (id, org_id, run_id, generation, state, holder_token,
                                         overrun, expires_at)
            SELECT md5('x{tag}' || i), 'scale-' || (i % {ORG_COUNT}), md5('r' || i), 1,
                   'reserved', md5('t' || i), false, now() - interval '1 hour'
            FROM generate_series(1, {n}) AS i""")
