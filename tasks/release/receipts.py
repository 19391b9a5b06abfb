"""Release the work receipts an attempt still holds when it ends (docs/design.md).

Pending or running receipts of an attempt whose launch can no longer write become
`released`, so the next run claims them at once; one `receipts.released` event records
the count. Called from release_attempt on every terminal path; the reaper retries what a
failed release left (release_orphans). A receipt whose owner is still live (an attempt the
reaper adopted while its runner may still run) is never touched here.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa

from models import WorkReceipt, db_now
from tasks.constants import RECEIPT_HELD, EventKind, ReceiptState
from tasks.store import ledger
from tasks.store.db import autocommit, session_scope
from tasks.store.fence import lock_run
from tasks.workreceipts.keys import owner_live

log = logging.getLogger("playrun.release")

ORPHAN_BATCH = 200


# Built once: every release asks it, and building it cost more than the round trip.
_ANY_HELD = sa.select(WorkReceipt.receipt_key).where(
    WorkReceipt.owner_run_id == sa.bindparam("run"),
    WorkReceipt.owner_generation == sa.bindparam("gen"),
    WorkReceipt.status.in_(sorted(RECEIPT_HELD))).limit(1)


def release_receipts(run_id: str, generation: int) -> int:
    """Release what attempt `generation` of the run still holds; returns how many."""
    with autocommit(readonly=True) as conn:
        # Most runs hold none: a read (one round trip on PostgreSQL) spares them a write
        # transaction. A receipt taken after it has a live owner, which is skipped anyway.
        if conn.scalar(_ANY_HELD, {"run": run_id, "gen": generation}) is None:
            return 0
    held = sa.and_(WorkReceipt.owner_run_id == run_id,
                   WorkReceipt.owner_generation == generation,
                   WorkReceipt.status.in_(list(RECEIPT_HELD)))
    with session_scope() as session:
        run = lock_run(session, run_id)  # run row first, as every writer does: no deadlock
        released = int(session.execute(
            sa.update(WorkReceipt)
            .where(held, ~owner_live())
            .values(status=ReceiptState.RELEASED, released_at=db_now(), updated_at=db_now())
        ).rowcount)  # type: ignore[attr-defined]
        if released and run is not None:  # a purged run has no ledger left to tell
            ledger.append(session, run_id, EventKind.RECEIPTS_RELEASED, {"count": released},
                          generation)
    if released:
        log.info("released %d receipt(s) of run %s gen %s", released, run_id, generation)
    return released


def release_orphans(limit: int = ORPHAN_BATCH) -> int:
    """The reaper's retry: held receipts whose owner attempt is over. Never raises."""
    try:
        with session_scope(readonly=True) as session:
            owners = session.execute(
                sa.select(WorkReceipt.owner_run_id, WorkReceipt.owner_generation)
                .where(WorkReceipt.status.in_(list(RECEIPT_HELD)), ~owner_live())
                .distinct().limit(limit)).all()
    except Exception:
        log.exception("looking for orphaned receipts failed")
        return 0
    total = 0
    for run_id, generation in owners:
        try:
            total += release_receipts(run_id, generation)
        except Exception:
            log.exception("releasing the receipts of run %s gen %s failed", run_id, generation)
    return total
