"""What operators see of placement: sandboxes live per provider and why recent attempts
went where they went, read at page or scrape time (nothing is kept up to date on the hot
path)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import RunEvent, RuntimeResource
from tasks.constants import EventKind, SandboxState

# Recent placements are counted among the newest ledger rows only: a bounded index range.
RECENT_EVENTS = 20_000


def live_by_provider(session: Session) -> dict[str, int]:
    """Sandboxes recorded live, by provider (one grouped count over the undeleted rows)."""
    return {str(name): int(n) for name, n in session.execute(
        sa.select(RuntimeResource.provider, sa.func.count())
        .where(RuntimeResource.state == SandboxState.LIVE)
        .group_by(RuntimeResource.provider))}


def recent_placements(session: Session,
                      window: int = RECENT_EVENTS) -> dict[str, dict[str, int]]:
    """provider -> reason -> `placement.chosen` events among the newest `window` ledger
    rows (a primary-key range, however long the ledger)."""
    newest = session.scalar(sa.select(sa.func.max(RunEvent.id)))
    if newest is None:
        return {}
    provider = RunEvent.data["provider"].as_string()
    reason = RunEvent.data["reason"].as_string()
    out: dict[str, dict[str, int]] = {}
    for name, why, n in session.execute(
        sa.select(provider, reason, sa.func.count())
        .where(RunEvent.id > newest - window, RunEvent.kind == EventKind.PLACEMENT_CHOSEN)
        .group_by(provider, reason)
    ):
        out.setdefault(str(name), {})[str(why)] = int(n)
    return out
