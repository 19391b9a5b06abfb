"""Traffic policy (SPEC 4.3): an operator switch in SQL that expires by itself."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import TrafficPolicy, db_now
from tasks.db import session_scope
from tasks.errors import PlayrunError

NORMAL = "normal"
HOLD = "hold_new_sandbox_starts"
THROTTLE = "sandbox_starts_per_minute"


class PolicyInvalidError(PlayrunError):
    """The traffic policy request is not valid."""

    code = "POLICY_INVALID"


@dataclass(frozen=True)
class Policy:
    mode: str
    starts_per_minute: float | None = None
    expires_at: datetime | None = None
    reason: str | None = None


def current(session: Session) -> Policy:
    """The newest unexpired policy row; none (or an explicit `normal`) means normal."""
    row = session.scalars(
        sa.select(TrafficPolicy)
        .where(sa.or_(TrafficPolicy.expires_at.is_(None), TrafficPolicy.expires_at > db_now()))
        .order_by(TrafficPolicy.id.desc())
        .limit(1)
    ).first()
    if row is None or row.mode == NORMAL:
        return Policy(NORMAL)
    return Policy(row.mode, row.starts_per_minute, row.expires_at, row.reason)


def read() -> Policy:
    with session_scope() as session:
        return current(session)


def set_policy(mode: str, *, for_s: float | None, starts_per_minute: float | None = None,
               reason: str | None = None) -> Policy:
    if mode not in (NORMAL, HOLD, THROTTLE):
        raise PolicyInvalidError(f"unknown traffic policy {mode!r}")
    if mode == THROTTLE and (starts_per_minute is None or starts_per_minute <= 0):
        raise PolicyInvalidError("a throttle needs a positive sandbox_starts_per_minute")
    if mode != NORMAL and (for_s is None or for_s <= 0):
        # Short-lived by design: a forgotten hold must not stop the fleet forever.
        raise PolicyInvalidError("hold and throttle need a positive duration (--for)")
    with session_scope() as session:
        session.add(TrafficPolicy(
            mode=mode, starts_per_minute=starts_per_minute if mode == THROTTLE else None,
            reason=reason, expires_at=db_now(for_s) if for_s else None,
        ))
    return read()
