"""Everything an attempt holder held is given back here, for every terminal path.

Rows carry the lease token of the holder that owns them (`holder_token`): a deferral
resumes the same generation under a new token, and the reaper re-tags the rows of an
attempt it adopts, so a release by token never touches the next holder's sandbox or slot.
"""

from __future__ import annotations

import logging

from tasks.release.capacity import release_lease
from tasks.release.receipts import release_receipts
from tasks.release.sandboxes import Released, release_sandboxes

log = logging.getLogger("playrun.release")


def release_attempt(run_id: str, generation: int, token: str) -> None:
    """Delete the holder's sandboxes, release the receipts its ended attempt still holds,
    then its capacity lease. Never raises."""
    try:
        released = release_sandboxes(run_id, generation, token, with_leases=True)
    except Exception:
        log.exception("releasing sandboxes of run %s gen %s failed", run_id, generation)
        released = Released(1)
    if released.leases_released:
        return  # no receipts held, and the leases went with the sandbox's mark
    left = released.left
    try:
        release_receipts(run_id, generation)  # only if that attempt can no longer write
    except Exception:
        log.exception("releasing the receipts of run %s gen %s failed", run_id, generation)
    if left:
        # The slot stays taken while a sandbox may still exist; the reaper retries.
        return
    try:
        release_lease(run_id, generation, token)
    except Exception:
        log.exception("releasing the capacity lease of run %s gen %s failed", run_id, generation)
