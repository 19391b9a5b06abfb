"""The run ledger: append-only events, written in the caller's transaction."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import RunEvent
from tasks.constants import EventKind


@dataclass(frozen=True)
class Event:
    """One ledger event: its `kind` (an `EventKind` value), `at` (database time,
    timezone-aware), `data`, the attempt `generation` it belongs to, and `seq`."""

    kind: str
    at: datetime
    data: dict[str, Any]
    generation: int | None
    seq: int = 0  # the event's position in the ledger: pass it as run_events(after=...)


def append(
    session: Session, run_id: str, kind: EventKind, data: dict[str, Any] | None = None,
    generation: int | None = None,
) -> None:
    """Add one event; fenced callers do this inside the fenced transaction."""
    session.add(RunEvent(run_id=run_id, kind=kind, data=data or {}, generation=generation))


def read(session: Session, run_id: str, *, after: int | None = None,
         limit: int | None = None) -> list[Event]:
    """Events in ledger order; `after` and `limit` page through them (keyset on id)."""
    stmt = sa.select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.id)
    if after is not None:
        stmt = stmt.where(RunEvent.id > after)
    if limit is not None:
        stmt = stmt.limit(limit)
    return [Event(kind=r.kind, at=r.at, data=dict(r.data or {}), generation=r.generation,
                  seq=r.id) for r in session.scalars(stmt)]
