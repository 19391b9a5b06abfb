"""Give an attempt holder's capacity leases back, once each, with a ledger event."""

from __future__ import annotations

import sqlalchemy as sa

from models import CapacityLease, db_now
from tasks.constants import LEASE_HELD as HELD
from tasks.constants import EventKind, LeaseState
from tasks.store import ledger
from tasks.store.db import driver_cursor, get_engine, session_scope, sql_list
from tasks.store.fence import lock_run

# One statement, so in autocommit it is one transaction and one round trip. The run row
# is locked first, as every writer here does, so this never deadlocks with a promote:
# no lease row is updated before the join has produced the (locked) run row.
_PG_RELEASE = f"""
WITH run AS (
    SELECT id FROM runs WHERE id = %(run)s FOR UPDATE
), released AS (
    UPDATE capacity_leases AS l SET state = '{LeaseState.RELEASED}', released_at = clock_timestamp()
    FROM run
    WHERE l.run_id = run.id AND l.generation = %(gen)s
      AND l.state IN ({sql_list(HELD)})
      AND (%(token)s::varchar IS NULL OR l.holder_token = %(token)s::varchar)
    RETURNING l.id
), events AS (
    INSERT INTO run_events (run_id, generation, kind, data)
    SELECT %(run)s, %(gen)s, '{EventKind.CAPACITY_RELEASED}', jsonb_build_object('lease_id', id)
    FROM released
)
SELECT id FROM released
"""


def release_lease(run_id: str, generation: int, token: str | None = None) -> list[str]:
    """Release what the holder with `token` (any holder if None) still holds; each
    release is recorded once."""
    if get_engine().dialect.name == "postgresql":
        with driver_cursor() as cur:
            cur.execute(_PG_RELEASE, {"run": run_id, "gen": generation, "token": token})
            return [row[0] for row in cur.fetchall()]
    with session_scope() as session:
        lock_run(session, run_id)
        cond = [CapacityLease.run_id == run_id, CapacityLease.generation == generation,
                CapacityLease.state.in_(HELD)]
        if token is not None:
            cond.append(CapacityLease.holder_token == token)
        released = list(session.scalars(sa.update(CapacityLease).where(*cond)
                                        .values(state=LeaseState.RELEASED, released_at=db_now())
                                        .returning(CapacityLease.id)))
        for lease_id in released:
            ledger.append(session, run_id, EventKind.CAPACITY_RELEASED, {"lease_id": lease_id},
                          generation)
    return released
