"""A run's first start on PostgreSQL in one autocommit statement: the traffic policy read,
the claim, attempt 1 with its `attempt.started` event, the run's new state and the capacity
reservation.

That is nearly every start, and the general transaction (tasks/acquisition/start.py) costs
seven round trips and the ORM's bookkeeping for it. Anything else (a run already tried, a
deferred attempt, a cancel, a locked or missing row, an early arrival) matches nothing
here, writes nothing, and is left to the general transaction, which decides it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from models import new_id
from tasks.acquisition import policy as traffic
from tasks.acquisition.claim import Claimed
from tasks.acquisition.policy import POLICY_ROWS_SQL
from tasks.constants import TERMINAL_STATUSES, AttemptState, EventKind, RunStatus
from tasks.store.db import ASYNC_COMMIT_SQL, driver_cursor, sql_list
from tasks.store.fence import Fence

# Generation 1 of a run no attempt ever opened. The run row is locked (SKIP LOCKED, as the
# general claim), so of any number of duplicate deliveries one matches and the rest fall
# through to the general claim, which then sees the attempt. The reservation runs only if
# asked (not under a hold) and is migration 0008's function, which locks the org row and
# counts after the lock. Both events go in by one INSERT, in ledger order. The commit does
# not wait for the WAL flush, as the general transaction (the launch record's does).
# The policy's unexpired rows come back for tasks/acquisition/policy.py to judge; the slot
# is not taken while any of them is a hold (a hold not in force is then reserved apart).
_FIRST_START = f"""
WITH quick AS ({ASYNC_COMMIT_SQL}), pol AS ({POLICY_ROWS_SQL}), claimed AS (
    SELECT r.id, r.org_id, r.input, r.play_digest FROM runs r, quick
    WHERE r.id = %(run)s AND r.current_generation = 0 AND r.cancel_requested_at IS NULL
      AND r.status NOT IN ({sql_list(TERMINAL_STATUSES)})
      AND (r.deferred_until IS NULL OR r.deferred_until <= clock_timestamp())
    FOR UPDATE OF r SKIP LOCKED
), opened AS (
    INSERT INTO attempts (id, run_id, generation, lease_token, worker_id, state,
                          lease_expires_at, events_offset, progress_count, progress_dropped)
    SELECT %(attempt)s, id, 1, %(token)s, %(worker)s, '{AttemptState.ACTIVE}',
           clock_timestamp() + make_interval(secs => %(lease_s)s), 0, 0, 0 FROM claimed
), moved AS (
    UPDATE runs r SET current_generation = 1, status = '{RunStatus.RUNNING}', deferred_until = NULL,
        updated_at = clock_timestamp()
    FROM claimed WHERE r.id = claimed.id
), res AS (
    SELECT f.used, f.lease_id, f.cap FROM claimed, LATERAL playrun_capacity_reserve(
        claimed.org_id, %(lease)s, claimed.id, 1, %(token)s, %(default)s::integer,
        %(observe)s, %(ttl)s) AS f
    WHERE %(reserve)s AND NOT EXISTS (SELECT 1 FROM pol WHERE pol.mode = '{traffic.HOLD}')
), events AS (
    INSERT INTO run_events (run_id, generation, kind, data)
    SELECT run_id, 1, kind, data FROM (
        SELECT 1 AS n, id AS run_id, '{EventKind.ATTEMPT_STARTED}' AS kind,
               '{{"generation": 1}}'::jsonb AS data FROM claimed
        UNION ALL
        SELECT 2, %(run)s, '{EventKind.CAPACITY_OVERRUN}', jsonb_build_object(
            'lease_id', res.lease_id, 'in_use', res.used, 'limit', res.cap)
        FROM res WHERE res.lease_id IS NOT NULL AND res.used >= res.cap
    ) AS e ORDER BY n
)
SELECT claimed.org_id, claimed.input, b.source, res.lease_id,
       %(reserve)s AND NOT EXISTS (SELECT 1 FROM pol WHERE pol.mode = '{traffic.HOLD}'),
       (SELECT coalesce(jsonb_agg(jsonb_build_array(id, mode, starts_per_minute, expires_at,
                                                    reason) ORDER BY id DESC), '[]')
        FROM pol), clock_timestamp()
FROM claimed LEFT JOIN res ON true LEFT JOIN play_bundles b ON b.digest = claimed.play_digest
"""


@dataclass(frozen=True)
class FirstStart:
    claimed: Claimed
    # Reserved (asked to, and no hold row): then lease_id is None only if the org was full.
    reserved: bool
    lease_id: str | None
    policy: traffic.Policy


def first_start(run_id: str, *, worker_id: str, lease_seconds: float, reserve: bool,
                org_capacity: int, observe: bool, reservation_ttl_s: float
                ) -> FirstStart | None:
    """Open attempt 1 of RUN_ID, read the traffic policy and (if `reserve` and no hold row
    is unexpired) take its capacity slot; None when the run is anything but a first start
    that is due, which the caller claims the general way."""
    token = secrets.token_hex(16)
    with driver_cursor() as cur:
        cur.execute(_FIRST_START, {
            "run": run_id, "attempt": new_id(), "token": token, "worker": worker_id,
            "lease_s": float(lease_seconds), "lease": new_id(), "default": org_capacity,
            "observe": observe, "ttl": float(reservation_ttl_s), "reserve": reserve})
        row: Any = cur.fetchone()
    if row is None:
        return None
    org_id, value, source, lease_id, reserved, policy_rows, now = row  # jsonb decoded
    claimed = Claimed(Fence(run_id, 1, token), org_id, source or "", value, False)
    return FirstStart(claimed, bool(reserved), lease_id, traffic.from_json(policy_rows, now))
