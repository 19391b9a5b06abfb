"""The run ledger: append-only events, written in the caller's transaction."""

from __future__ import annotations

from collections.abc import Sequence
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


def _count(session: Session, run_id: str, generation: int, kinds: Sequence[str],
           limit: int) -> int:
    """Rows of these kinds this attempt wrote, counted up to `limit` (bounded work)."""
    rows = sa.select(sa.literal(1)).where(
        RunEvent.run_id == run_id, RunEvent.generation == generation,
        RunEvent.kind.in_(list(kinds))).limit(limit).subquery()
    return int(session.scalar(sa.select(sa.func.count()).select_from(rows)) or 0)


def append_budgeted(session: Session, run_id: str, generation: int, kind: EventKind,
                    data: dict[str, Any], *, group: str, kinds: Sequence[str],
                    budget: int) -> bool:
    """Append unless the attempt wrote `budget` rows of `kinds` already; then one
    `ledger.budget_spent` row for the group says so, and nothing more. True if written."""
    if _count(session, run_id, generation, kinds, budget) < budget:
        append(session, run_id, kind, data, generation)
        return True
    spent(session, run_id, generation, group=group, budget=budget)
    return False


def spent(session: Session, run_id: str, generation: int, *, group: str, budget: int) -> None:
    """The attempt's one `ledger.budget_spent` row for this group, unless it has it."""
    if not session.scalar(sa.select(sa.literal(1)).where(
            RunEvent.run_id == run_id, RunEvent.generation == generation,
            RunEvent.kind == EventKind.LEDGER_BUDGET_SPENT,
            RunEvent.data["group"].as_string() == group).limit(1)):
        append(session, run_id, EventKind.LEDGER_BUDGET_SPENT,
               {"group": group, "budget": budget}, generation)


def bump_reused(session: Session, run_id: str, generation: int, key: str) -> bool:
    """Count one more reuse on the attempt's `step.reused` row of this key; False if the
    attempt has none yet. The row's count is the one field that changes after append."""
    row = session.scalars(sa.select(RunEvent).where(
        RunEvent.run_id == run_id, RunEvent.generation == generation,
        RunEvent.kind == EventKind.STEP_REUSED,
        RunEvent.data["key"].as_string() == key).limit(1)).first()
    if row is None:
        return False
    data = dict(row.data or {})
    data["count"] = min(int(data.get("count", 1)) + 1, 2**31 - 1)
    row.data = data
    return True


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
