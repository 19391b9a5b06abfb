"""A pushed terminal on PostgreSQL in one statement: the launch fence, the attempt's end,
the run's terminal fields and their ledger events, one durable round trip. It also reads
the holder's sandboxes, so that the release carries them and need not read them again.

It writes only when this launch is current on an open run with no cancel recorded. Any
other case changes nothing and answers None: the general transaction (terminal.py) then
reports the terminal that won, the cancel, or the lost fence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from tasks.constants import TERMINAL_EVENT, AttemptState, EventKind, SandboxState
from tasks.settlement.outcome import Outcome
from tasks.store.fence import LaunchFence, held_launch_sql

# The two events go in by one INSERT in ledger order: the ids of rows inserted by
# separate CTEs of one statement follow no defined order.
_SQL = f"""
WITH held AS ({held_launch_sql(
    "r.id, r.created_at, a.id AS attempt_id, a.lease_token, a.host_queue, "
    "a.progress_dropped, a.progress_count")}), ended AS (
    UPDATE attempts a SET state = '{AttemptState.ENDED}', end_reason = %(reason)s,
        ended_at = clock_timestamp()
    FROM held WHERE a.id = held.attempt_id
    RETURNING a.id
), settled AS (
    UPDATE runs r SET status = %(status)s, code = %(code)s, error = %(error)s,
        output = %(output)s::jsonb, finished_at = clock_timestamp(),
        updated_at = clock_timestamp(), deferred_until = NULL
    FROM held WHERE r.id = held.id
    RETURNING r.id
), events AS (
    INSERT INTO run_events (run_id, generation, kind, data)
    SELECT e.run_id, %(gen)s, e.kind, e.data FROM (
        SELECT 1 AS n, held.id AS run_id, '{EventKind.PROGRESS_DROPPED}' AS kind,
               jsonb_build_object('dropped', held.progress_dropped,
                                  'kept', held.progress_count) AS data
        FROM held WHERE held.progress_dropped > 0
        UNION ALL
        SELECT 2, settled.id, %(kind)s, %(data)s::jsonb FROM settled
    ) e ORDER BY e.n
), boxes AS (
    SELECT x.id, x.provider, x.sandbox_id FROM runtime_resources x, held
    WHERE x.run_id = held.id AND x.generation = %(gen)s
      AND x.holder_token = held.lease_token AND x.state <> '{SandboxState.DELETED}'
)
SELECT held.lease_token, held.host_queue, held.created_at,
       (SELECT array_agg(ARRAY[b.id, b.provider, b.sandbox_id]) FROM boxes b)
FROM held
"""


@dataclass(frozen=True)
class Written:
    holder_token: str
    host_queue: str | None
    created_at: datetime
    # The holder's one undeleted sandbox (id, provider, sandbox id): its release need not
    # look it up. None when it has none or several.
    sandbox: tuple[str, str, str] | None = None


def settle(cur: psycopg.Cursor[Any], fence: LaunchFence, outcome: Outcome,
           reason: str) -> Written | None:
    """Run the statement on an autocommit cursor; None if it wrote nothing."""
    cur.execute(_SQL, {
        "run": fence.run_id, "gen": fence.generation, "launch": fence.launch_id,
        "reason": reason, "status": outcome.status, "code": outcome.code,
        "error": outcome.error, "output": json.dumps(outcome.output),
        "kind": TERMINAL_EVENT[outcome.status],
        "data": json.dumps({"code": outcome.code, "error": outcome.error}),
    })
    row = cur.fetchone()
    if row is None:
        return None
    boxes = row[3] or []
    return Written(row[0], row[1], row[2], tuple(boxes[0]) if len(boxes) == 1 else None)
