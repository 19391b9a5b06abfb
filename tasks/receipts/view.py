"""Work receipts (SPEC 4.7): their key, the liveness of their owner, and the app-code views.

A receipt is keyed by sha256 of (org, play name, step key) and owned by the launch of the
attempt that claimed it. The gateway's step actions (tasks/gateway/actions/steps.py) claim,
complete and fail them; the release step (tasks/release/receipts.py) frees what an attempt
still holds when it ends.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePath
from typing import Any

import sqlalchemy as sa

from models import Attempt, Run, WorkReceipt, db_now
from tasks.constants import (
    ATTEMPT_ACTIVE,
    MAX_STEP_KEY_CHARS,
    RECEIPT_HELD,
    TERMINAL_STATUSES,
)
from tasks.parse.checks import check_name
from tasks.store.db import ensure_schema_once, session_scope

MAX_ORG_CHARS = 128
MAX_PLAY_CHARS = 255


def play_name(play_path: str) -> str:
    """A play's name is its file name without `.py` (`plays/enrich.py` -> `enrich`)."""
    name = PurePath(play_path).name
    return name[:-3] if name.endswith(".py") and len(name) > 3 else name


def receipt_key(org_id: str, play: str, step_key: str) -> str:
    """sha256 of the three parts, encoded without ambiguity (a JSON array)."""
    text = json.dumps([org_id, play, step_key], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def owner_live(lease_grace_s: float | None = None) -> sa.ColumnElement[bool]:
    """True for a receipt whose owning launch can still write: its attempt is active in the
    run's current generation and the run is open. With `lease_grace_s`, also its lease ran
    out less than that long ago (a claim takes over from a holder silent for longer; the
    reaper adopts a silent runner well before). Correlates to WorkReceipt."""
    where = [Attempt.run_id == WorkReceipt.owner_run_id,
             Attempt.generation == WorkReceipt.owner_generation,
             Attempt.launch_id == WorkReceipt.owner_launch_id,
             Attempt.state == ATTEMPT_ACTIVE,
             Run.current_generation == Attempt.generation,
             Run.status.not_in(list(TERMINAL_STATUSES))]
    if lease_grace_s is not None:
        where.append(Attempt.lease_expires_at > db_now(-lease_grace_s))
    return sa.select(Attempt.id).join(Run, Run.id == Attempt.run_id).where(*where).exists()


@dataclass(frozen=True)
class ReceiptView:
    key: str
    play: str
    org_id: str
    status: str
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
    return ReceiptView(key=r.step_key, play=r.play, org_id=r.org_id, status=r.status,
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
