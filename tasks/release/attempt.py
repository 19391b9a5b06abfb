"""Everything an ended attempt held is given back here, in one place for every terminal path."""

from __future__ import annotations

import logging

from tasks.release.sandboxes import release_sandboxes

log = logging.getLogger("playrun.release")


def release_attempt(run_id: str, generation: int) -> None:
    """Delete sandboxes, then release the capacity lease. Never raises: GC retries."""
    try:
        left = release_sandboxes(run_id, generation)
    except Exception:  # a release must never change the run's outcome
        log.exception("releasing sandboxes of run %s gen %s failed", run_id, generation)
        return
    if left:
        # The slot stays taken while a sandbox may still exist; GC releases it after deleting.
        return
    try:
        from tasks.acquisition.capacity import release_lease

        release_lease(run_id, generation)
    except Exception:
        log.exception("releasing the capacity lease of run %s gen %s failed", run_id, generation)
