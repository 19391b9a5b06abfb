"""Give an attempt holder's capacity leases back, once each, with a ledger event."""

from __future__ import annotations

import sqlalchemy as sa

from models import CapacityLease, db_now
from tasks import ledger
from tasks.constants import EV_CAPACITY_RELEASED
from tasks.constants import LEASE_HELD as HELD
from tasks.constants import LEASE_RELEASED as RELEASED
from tasks.db import session_scope
from tasks.fence import lock_run


def release_lease(run_id: str, generation: int, token: str | None = None) -> list[str]:
    """Release what the holder with `token` (any holder if None) still holds; each
    release is recorded once."""
    with session_scope() as session:
        # Run row first, like every writer here, so this never deadlocks with a promote.
        lock_run(session, run_id)
        cond = [CapacityLease.run_id == run_id, CapacityLease.generation == generation,
                CapacityLease.state.in_(HELD)]
        if token is not None:
            cond.append(CapacityLease.holder_token == token)
        ids = list(session.scalars(sa.select(CapacityLease.id).where(*cond)))
        released = []
        for lease_id in ids:
            changed = session.execute(
                sa.update(CapacityLease)
                .where(CapacityLease.id == lease_id, CapacityLease.state.in_(HELD))
                .values(state=RELEASED, released_at=db_now())
            ).rowcount  # type: ignore[attr-defined]
            if changed:
                ledger.append(session, run_id, EV_CAPACITY_RELEASED, {"lease_id": lease_id},
                              generation)
                released.append(lease_id)
    return released
