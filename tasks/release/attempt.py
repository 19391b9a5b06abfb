"""Everything an ended attempt held is given back here, in one place for every terminal path."""

from __future__ import annotations

import logging

import sqlalchemy as sa

from tasks.release.sandboxes import release_sandboxes

log = logging.getLogger("playrun.release")


def _still_active(run_id: str, generation: int) -> bool:
    """An active attempt belongs to whoever holds its fence now (the reaper after adopting
    it, or a worker that resumed a deferral: same generation, new lease token)."""
    from models import Attempt
    from tasks.constants import ATTEMPT_ACTIVE
    from tasks.db import session_scope

    with session_scope() as session:
        return bool(session.scalar(sa.select(sa.func.count()).where(
            Attempt.run_id == run_id, Attempt.generation == generation,
            Attempt.state == ATTEMPT_ACTIVE)))


def release_attempt(run_id: str, generation: int) -> None:
    """Delete sandboxes, then release the capacity lease. Never raises: GC retries.

    Called by a writer whose fence was lost while the attempt is active again under a
    new token, it deletes only the sandboxes recorded for cleanup (its own late ones) and
    leaves the live sandbox and the lease to the current holder.
    """
    try:
        active = _still_active(run_id, generation)
        left = release_sandboxes(run_id, generation, only_cleanup=active)
    except Exception:  # a release must never change the run's outcome
        log.exception("releasing sandboxes of run %s gen %s failed", run_id, generation)
        return
    if left or active:
        # The slot stays taken while a sandbox may still exist; GC releases it after deleting.
        return
    try:
        from tasks.acquisition.capacity import release_lease

        release_lease(run_id, generation)
    except Exception:
        log.exception("releasing the capacity lease of run %s gen %s failed", run_id, generation)
