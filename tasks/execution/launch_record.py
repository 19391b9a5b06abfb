"""The launch record on PostgreSQL in one statement: the fence, the sandbox's live record
and event, the capacity promotion and the launch mark, one durable round trip.

It writes only in the common case (a sandbox reported once, a reserved lease). Any other
case changes nothing and answers MISSED, and the caller runs the general transaction,
which tells a second report from a lost fence and says which part of the fence failed.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from models import new_id
from tasks.acquisition.sandbox import requested
from tasks.constants import AttemptState, EventKind, LeaseState, SandboxState
from tasks.sandbox import SandboxRef
from tasks.store.db import one_row
from tasks.store.fence import Fence, fence_params, held_sql

_LEASE_JOIN = f"""
    JOIN capacity_leases l ON l.id = %(lease)s AND l.run_id = r.id
      AND l.generation = r.current_generation AND l.state = '{LeaseState.RESERVED}'"""

# held: the run, its attempt (and the reserved lease), locked; live: the sandbox's
# record unless one exists (then nothing below writes); moved: the lease goes live;
# event: `sandbox.requested` (dated back to the ask) unless written already, then
# `sandbox.live`, in ledger order;
# marked: the launch, unless a cancel is recorded (the release then deletes the sandbox).
_SQL = """
WITH held AS ({held}), live AS (
    INSERT INTO runtime_resources (id, run_id, generation, provider, sandbox_id, labels,
                                   state, holder_token)
    SELECT %(resource)s, held.id, %(gen)s, %(provider)s, %(sandbox)s, %(labels)s::jsonb,
           '{live}', %(token)s FROM held
    ON CONFLICT (provider, sandbox_id) DO NOTHING
    RETURNING run_id
), moved AS ({moved}), event AS (
    INSERT INTO run_events (run_id, generation, kind, data, at)
    SELECT live.run_id, %(gen)s, e.kind, e.data, e.at FROM live, (
        SELECT 1 AS n, '{requested}' AS kind, %(requested)s::jsonb AS data,
               clock_timestamp() - make_interval(secs => %(ago)s) AS at
        WHERE %(requested)s::jsonb IS NOT NULL
        UNION ALL
        SELECT 2, '{event}', %(event)s::jsonb, clock_timestamp()
    ) AS e ORDER BY e.n
), marked AS (
    UPDATE attempts a SET provider = %(provider)s, sandbox_id = %(sandbox)s,
        host_queue = %(host_queue)s, launch_id = %(launch)s,
        runner_started_at = clock_timestamp(),
        runner_deadline = clock_timestamp() + make_interval(secs => %(deadline_s)s),
        lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_s)s)
    FROM held, live
    WHERE a.run_id = live.run_id AND a.generation = %(gen)s AND a.lease_token = %(token)s
      AND a.state = '{active}' AND held.cancel_requested_at IS NULL
    RETURNING a.id
)
SELECT (SELECT count(*) FROM live), (SELECT count(*) FROM marked),
       (SELECT created_at FROM held), clock_timestamp()
"""

_MOVED = f"""
    UPDATE capacity_leases l SET state = '{LeaseState.LIVE}', provider = %(provider)s,
        sandbox_id = %(sandbox)s, live_at = clock_timestamp(), expires_at = NULL
    FROM live WHERE l.id = %(lease)s AND l.run_id = live.run_id
    RETURNING l.id"""


def _statement(with_lease: bool) -> str:
    held = held_sql("r.id, r.cancel_requested_at, r.created_at",
                    _LEASE_JOIN if with_lease else "", "r, a, l" if with_lease else "r, a")
    moved = _MOVED if with_lease else "SELECT 1"
    return _SQL.format(held=held, moved=moved, live=SandboxState.LIVE, event=EventKind.SANDBOX_LIVE,
                       requested=EventKind.SANDBOX_REQUESTED, active=AttemptState.ACTIVE)


_STATEMENTS = {True: _statement(True), False: _statement(False)}


class Recorded(enum.Enum):
    LAUNCHING = "launching"  # all written: exec may follow
    CANCELLED = "cancelled"  # the sandbox is on record and its lease live; no launch
    MISSED = "missed"  # nothing written: not the common case (see the module doc)


@dataclass(frozen=True)
class FastRecord:
    outcome: Recorded
    created_at: datetime | None = None  # the run's admission, for the start metric
    db_time: float = 0.0  # epoch seconds by the database clock


def record(cur: psycopg.Cursor[Any], fence: Fence, sandbox: SandboxRef, lease_id: str | None,
           *, launch_id: str, host_queue: str | None, deadline_s: float,
           lease_s: float) -> FastRecord:
    """Run the statement on an autocommit cursor (one statement: one transaction)."""
    owed = requested(sandbox)
    params = {
        **fence_params(fence), "lease": lease_id, "resource": new_id(),
        "provider": sandbox.provider, "sandbox": sandbox.sandbox_id,
        "labels": json.dumps(dict(sandbox.labels)),
        "event": json.dumps({"sandbox_id": sandbox.sandbox_id,
                             "provider": sandbox.provider}),
        "host_queue": host_queue, "launch": launch_id, "deadline_s": float(deadline_s),
        "lease_s": float(lease_s), "requested": None if owed is None else owed[0],
        "ago": 0.0 if owed is None else owed[1],
    }
    cur.execute(_STATEMENTS[lease_id is not None], params)
    live, marked, created_at, now = one_row(cur)
    if not live:
        return FastRecord(Recorded.MISSED)
    if not marked:
        return FastRecord(Recorded.CANCELLED, created_at)
    return FastRecord(Recorded.LAUNCHING, created_at, now.timestamp())
