"""What follows a sandbox's deletion on PostgreSQL, in one statement: the deleted mark,
and, when the attempt holds no work receipts, the holder's capacity leases, with their
ledger events in release order (sandbox.deleted, then capacity.released).

With receipts held the leases are left alone, so the receipts go back first (attempt.py)
and the next run of the org never meets a receipt still held by this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from tasks.constants import LEASE_HELD, RECEIPT_HELD, EventKind, LeaseState, SandboxState
from tasks.store.db import one_row, sql_list

# The run row is locked first, as every writer does (both updates join it). The events go
# in by one INSERT in release order: rows inserted by separate CTEs have no defined order.
_SQL = f"""
WITH run AS (
    SELECT id FROM runs WHERE id = %(run)s FOR UPDATE
), receipts AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM work_receipts
        WHERE owner_run_id = %(run)s AND owner_generation = %(gen)s
          AND status IN ({sql_list(RECEIPT_HELD)})
        LIMIT 1) held
), gone AS (
    UPDATE runtime_resources AS r SET state = '{SandboxState.DELETED}',
        deleted_at = clock_timestamp(), updated_at = clock_timestamp()
    FROM run
    WHERE r.id = %(rid)s AND r.run_id = run.id AND r.state <> '{SandboxState.DELETED}'
    RETURNING r.id
), released AS (
    UPDATE capacity_leases AS l SET state = '{LeaseState.RELEASED}',
        released_at = clock_timestamp()
    FROM run, receipts
    WHERE receipts.n = 0 AND l.run_id = run.id AND l.generation = %(gen)s
      AND l.state IN ({sql_list(LEASE_HELD)}) AND l.holder_token = %(token)s
    RETURNING l.id
), events AS (
    INSERT INTO run_events (run_id, generation, kind, data)
    SELECT %(run)s, %(gen)s, e.kind, e.data FROM (
        SELECT 0 AS n, '{EventKind.SANDBOX_DELETED}' AS kind,
               jsonb_build_object('sandbox_id', %(sid)s::text) AS data FROM gone
        UNION ALL
        SELECT 1, '{EventKind.CAPACITY_RELEASED}', jsonb_build_object('lease_id', id) FROM released
    ) e ORDER BY e.n
)
SELECT (SELECT n FROM receipts), (SELECT count(*) FROM released)
"""


@dataclass(frozen=True)
class AfterDelete:
    receipts_held: bool  # the leases were left: release the receipts, then the leases
    leases_released: int


def mark_and_release(cur: psycopg.Cursor[Any], *, run_id: str, generation: int, token: str,
                     resource_id: str, sandbox_id: str) -> AfterDelete:
    """Run the statement on an autocommit cursor (one statement: one transaction)."""
    cur.execute(_SQL, {"run": run_id, "gen": generation, "token": token, "rid": resource_id,
                       "sid": sandbox_id})
    held, released = one_row(cur)
    return AfterDelete(bool(held), int(released))
