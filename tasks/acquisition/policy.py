"""Traffic policy (docs/design.md): an operator switch in SQL that expires by itself.

`set_policy` refuses a bad request before it is stored; `current` checks every row
again as it reads it, so a row written some other way (by hand, an older build)
with a NaN or negative rate, an unknown mode or an absurd expiry is ignored with a
log line, never applied: it cannot stop the fleet's sandbox starts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import psycopg
import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import TrafficPolicy, db_now
from tasks.constants import MAX_DURATION_S, MAX_STARTS_PER_MINUTE
from tasks.errors import PolicyInvalidError
from tasks.parse.checks import check_note, check_rate, check_seconds
from tasks.store.db import session_scope

__all__ = ["HOLD", "NORMAL", "POLICY_ROWS_SQL", "THROTTLE", "Policy", "PolicyInvalidError",
           "PolicyRow", "current", "current_pg", "from_json", "read", "set_policy"]

log = logging.getLogger("playrun.policy")

NORMAL = "normal"
HOLD = "hold_new_sandbox_starts"
THROTTLE = "sandbox_starts_per_minute"
MODES = (NORMAL, HOLD, THROTTLE)
# Unexpired rows looked at per read: past this many bad ones in a row, normal applies.
_SCAN = 20
# Clock slack between the writer's database time and the reader's.
_EXPIRY_SLACK = timedelta(minutes=5)
MAX_REASON_CHARS = 1000
_reported: set[int] = set()  # rows already logged as ignored by this process


@dataclass(frozen=True)
class Policy:
    mode: str
    starts_per_minute: float | None = None
    expires_at: datetime | None = None
    reason: str | None = None


class PolicyRow(NamedTuple):
    """A stored row as read, by the ORM or by a driver cursor."""

    id: int
    mode: str
    starts_per_minute: Any
    expires_at: datetime | None
    reason: str | None


def problem(row: PolicyRow, now: datetime) -> str | None:
    """Why a stored row must not be applied, or None when it is sound."""
    if row.mode not in MODES:
        return f"unknown mode {row.mode!r}"
    if row.mode == NORMAL:
        return None
    if row.expires_at is None:
        return f"{row.mode} without an expiry"
    if row.expires_at - now > timedelta(seconds=MAX_DURATION_S) + _EXPIRY_SLACK:
        return f"expiry {row.expires_at.isoformat()} is more than {MAX_DURATION_S:g}s away"
    if row.mode == THROTTLE:
        rate = row.starts_per_minute
        if (rate is None or isinstance(rate, bool) or not isinstance(rate, (int, float))
                or not math.isfinite(rate) or not 0 < rate <= MAX_STARTS_PER_MINUTE):
            return f"sandbox_starts_per_minute {rate!r} is not in (0, {MAX_STARTS_PER_MINUTE:g}]"
    return None


# Built once: every start reads it.
_CURRENT = (
    sa.select(TrafficPolicy.id, TrafficPolicy.mode, TrafficPolicy.starts_per_minute,
              TrafficPolicy.expires_at, TrafficPolicy.reason, db_now().label("now"))
    .where(sa.or_(TrafficPolicy.expires_at.is_(None), TrafficPolicy.expires_at > db_now()))
    .order_by(TrafficPolicy.id.desc())
    .limit(_SCAN)
)
# The same rows for PostgreSQL's driver cursors; the first start reads them in its statement.
POLICY_ROWS_SQL = f"""
SELECT id, mode, starts_per_minute, expires_at, reason FROM traffic_policies
WHERE expires_at IS NULL OR expires_at > clock_timestamp() ORDER BY id DESC LIMIT {_SCAN}
"""
_CURRENT_PG = f"""
SELECT p.*, clock_timestamp() FROM ({POLICY_ROWS_SQL}) p ORDER BY p.id DESC
"""


def current(session: Session) -> Policy:
    """The newest sound unexpired policy row; none (or an explicit `normal`) means normal."""
    return _pick((PolicyRow(*row[:5]), row[5]) for row in session.execute(_CURRENT))


def current_pg(cur: psycopg.Cursor[Any]) -> Policy:
    """`current` on a PostgreSQL driver cursor (its own autocommit read)."""
    cur.execute(_CURRENT_PG)
    return _pick((PolicyRow(i, mode, rate, _utc(expires), reason), _utc(now))
                 for i, mode, rate, expires, reason, now in cur.fetchall())


def from_json(rows: list[list[Any]], now: datetime) -> Policy:
    """`current` from POLICY_ROWS_SQL's rows as a jsonb array of arrays, newest first."""
    return _pick((PolicyRow(i, mode, rate, _utc(_instant(expires)), reason), _utc(now))
                 for i, mode, rate, expires, reason in rows)


def _instant(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _utc(value: datetime | None) -> datetime | None:
    # psycopg hands timestamptz back in the session's time zone; the ORM's type in UTC.
    return None if value is None else value.astimezone(UTC)


def _pick(rows: Iterable[tuple[PolicyRow, Any]]) -> Policy:
    for row, now in rows:
        why = problem(row, now)
        if why is not None:
            if row.id not in _reported:
                _reported.add(row.id)
                log.warning("ignoring invalid traffic policy row %s: %s", row.id, why)
            continue
        if row.mode == NORMAL:
            return Policy(NORMAL)
        return Policy(row.mode, row.starts_per_minute, row.expires_at, row.reason)
    return Policy(NORMAL)


def read() -> Policy:
    with session_scope() as session:
        return current(session)


def set_policy(mode: str, *, for_s: float | None, starts_per_minute: float | None = None,
               reason: str | None = None) -> Policy:
    if mode not in MODES:
        raise PolicyInvalidError(f"unknown traffic policy {mode!r}")
    rate = None
    if mode == THROTTLE:
        if starts_per_minute is None:
            raise PolicyInvalidError("a throttle needs a positive sandbox_starts_per_minute")
        rate = check_rate(starts_per_minute)
    seconds = None
    if mode != NORMAL:
        if for_s is None:
            # Short-lived by design: a forgotten hold must not stop the fleet forever.
            raise PolicyInvalidError("hold and throttle need a positive duration (--for)")
        seconds = check_seconds(for_s, "the policy duration (--for)", error=PolicyInvalidError)
    elif for_s is not None:
        seconds = check_seconds(for_s, "the policy duration (--for)", error=PolicyInvalidError)
    if reason is not None:
        reason = check_note(reason, "the reason", MAX_REASON_CHARS, PolicyInvalidError)
    with session_scope() as session:
        session.add(TrafficPolicy(
            mode=mode, starts_per_minute=rate, reason=reason,
            expires_at=db_now(seconds) if seconds else None,
        ))
    return read()
