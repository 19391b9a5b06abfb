"""The end of a run, for every path (pushed, inspected, cancelled, failed before code):
settle first-write-wins, then release what the holder held, whoever won."""

from __future__ import annotations

import logging

import sqlalchemy as sa

from models import Attempt, Run
from tasks.constants import AttemptState
from tasks.errors import FenceLostError
from tasks.release.attempt import release_attempt
from tasks.release.sandboxes import release_sandboxes
from tasks.settlement.outcome import CANCELLED_OUTCOME, Outcome
from tasks.settlement.terminal import CANCEL_REASON, Settled, settle
from tasks.store.db import session_scope
from tasks.store.fence import Fence

log = logging.getLogger("playrun.finish")


def _flags(fence: Fence) -> tuple[bool, bool]:
    """(this holder is still the active one, a cancel was requested)."""
    with session_scope(readonly=True) as session:
        row = session.execute(
            sa.select(Attempt.state == AttemptState.ACTIVE, Run.cancel_requested_at.is_not(None))
            .join(Run, Run.id == Attempt.run_id)
            .where(Attempt.run_id == fence.run_id, Attempt.generation == fence.generation,
                   Attempt.lease_token == fence.lease_token)).first()
    return (bool(row[0]), bool(row[1])) if row else (False, False)


def finish(fence: Fence, outcome: Outcome, reason: str) -> Settled | None:
    """Settle, then release. With a cancel requested, the sandbox goes before the final run
    write (docs/design.md). If the write fails while this holder is still the active one (its
    lease merely ran out), nothing is released: the reaper adopts the attempt and settles
    it from the sandbox, which must still be there. None when the fence was lost."""
    if _flags(fence)[1]:
        release_sandboxes(fence.run_id, fence.generation, fence.lease_token)
        outcome, reason = CANCELLED_OUTCOME, CANCEL_REASON
    try:
        result = settle(fence, outcome, reason=reason)
    except Exception as exc:
        if _flags(fence)[0]:
            log.warning("run %s not settled yet (%s); left to the reaper", fence.run_id, exc)
        else:
            release_attempt(fence.run_id, fence.generation, fence.lease_token)
        if isinstance(exc, FenceLostError):
            return None
        raise
    if not result.won:
        log.info("run %s was already %s", fence.run_id, result.outcome.status)
    release_attempt(fence.run_id, fence.generation, fence.lease_token)
    return result
