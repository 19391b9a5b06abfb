"""The run ledger: append-only events, written in the caller's transaction."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import RunEvent


@dataclass(frozen=True)
class Event:
    kind: str
    at: datetime
    data: dict[str, Any]
    generation: int | None


def append(
    session: Session, run_id: str, kind: str, data: dict[str, Any] | None = None,
    generation: int | None = None,
) -> None:
    """Add one event; fenced callers do this inside the fenced transaction."""
    session.add(RunEvent(run_id=run_id, kind=kind, data=data or {}, generation=generation))


def read(session: Session, run_id: str) -> list[Event]:
    rows = session.scalars(
        sa.select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.id)
    )
    return [Event(kind=r.kind, at=r.at, data=dict(r.data or {}), generation=r.generation)
            for r in rows]
