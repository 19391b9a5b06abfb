"""Work receipts as app code sees them: list and clear an org's receipts.

The gateway's step actions claim, complete and fail receipts through
tasks/workreceipts/store.py; the release step (tasks/release/receipts.py) frees what an
attempt still holds when it ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from models import WorkReceipt
from tasks.constants import MAX_STEP_KEY_CHARS, RECEIPT_HELD, ReceiptState
from tasks.parse.checks import check_name
from tasks.store.db import ensure_schema_once, session_scope
from tasks.workreceipts.keys import play_name

MAX_ORG_CHARS = 128
MAX_PLAY_CHARS = 255


@dataclass(frozen=True)
class ReceiptView:
    """One work receipt of `ctx.step`: its step key, play and org, status, stored output,
    and the run that holds, computed or last tried it."""

    key: str
    play: str
    org_id: str
    status: ReceiptState
    output: Any
    # The run that holds it (pending/running), computed it (completed) or last tried it.
    run_id: str
    generation: int
    created_at: datetime
    completed_at: datetime | None
    expires_at: datetime | None
    updated_at: datetime
    code: str | None
    error: str | None
    claims: int


def _view(r: WorkReceipt) -> ReceiptView:
    return ReceiptView(key=r.step_key, play=r.play, org_id=r.org_id, status=ReceiptState(r.status),
                       output=r.output, run_id=r.owner_run_id, generation=r.owner_generation,
                       created_at=r.created_at, completed_at=r.completed_at,
                       expires_at=r.expires_at, updated_at=r.updated_at, code=r.code,
                       error=r.error, claims=r.claim_count)


def _scope(org_id: str, play: str | None, key: str | None = None) -> list[sa.ColumnElement[bool]]:
    check_name(org_id, "org_id", MAX_ORG_CHARS)
    where = [WorkReceipt.org_id == org_id]
    if play is not None:
        where.append(WorkReceipt.play == play_name(check_name(play, "play", 1024)))
    if key is not None:
        where.append(WorkReceipt.step_key == check_name(key, "key", MAX_STEP_KEY_CHARS))
    return where


def receipts(org_id: str, play: str | None = None, *, limit: int | None = None
             ) -> list[ReceiptView]:
    """An org's work receipts (of one play, by name or path), by play then step key."""
    where = _scope(org_id, play)
    ensure_schema_once()
    stmt = sa.select(WorkReceipt).where(*where).order_by(WorkReceipt.play,
                                                         WorkReceipt.step_key)
    if limit is not None:
        stmt = stmt.limit(max(int(limit), 0))
    with session_scope(readonly=True) as session:
        return [_view(r) for r in session.scalars(stmt)]


def clear_receipts(org_id: str, play: str | None = None, key: str | None = None) -> int:
    """Delete an org's receipts (of one play, of one step key); the next ctx.step runs its
    fn again. Receipts held by a running step are left alone. Returns how many went."""
    where = _scope(org_id, play, key)
    ensure_schema_once()
    with session_scope() as session:
        result = session.execute(sa.delete(WorkReceipt).where(
            *where, WorkReceipt.status.not_in(list(RECEIPT_HELD))))
        return int(result.rowcount)  # type: ignore[attr-defined]
