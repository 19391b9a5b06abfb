"""`playrun pool set|show|remove`: an operator's pools, checked before anything is stored.

A pool is named by its placement policy (or `default`, for runs that name none) and keeps
warm sandboxes of that policy's primary provider.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa

from models import PoolMember, WarmPool, db_now
from tasks.admission.placement import check_name, policy_named
from tasks.constants import DEFAULT_POOL, MAX_SQL_INT, PROVIDER_NAMES, PoolMemberState
from tasks.errors import (
    PlacementInvalidError,
    PlacementUnknownError,
    PoolInvalidError,
    PoolUnknownError,
)
from tasks.parse.durations import parse_duration
from tasks.settings import get_settings
from tasks.store.db import session_scope

# A warm sandbox older than this is stale whatever the operator asks (providers cap lifetimes).
MAX_TTL_S = 24 * 3600.0
MIN_TTL_S = 10.0
DEFAULT_TTL_S = 1800.0
MAX_POOL_SIZE = 1000


@dataclass(frozen=True)
class Pool:
    name: str
    provider: str
    min_ready: int
    max_ready: int
    ttl_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_POOL_SIZE:
        raise PoolInvalidError(f"{what} must be a whole number from 0 to {MAX_POOL_SIZE}, "
                               f"not {str(value)[:40]!r}")
    return value


def check_pool_name(value: Any) -> str:
    try:
        return check_name(value)
    except PlacementInvalidError as exc:
        raise PoolInvalidError(exc.message.replace("placement name", "pool name")) from None


def build(name: Any, min_ready: Any, max_ready: Any, ttl: Any = None,
          provider: Any = None) -> Pool:
    """A pool from untrusted arguments: POOL_INVALID (or PLACEMENT_UNKNOWN) when wrong."""
    name = check_pool_name(name)
    low, high = _count(min_ready, "--min"), _count(max_ready, "--max")
    if low > high:
        raise PoolInvalidError(f"--min ({low}) must not exceed --max ({high})")
    ttl_s = DEFAULT_TTL_S if ttl is None else parse_duration(ttl)
    if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise PoolInvalidError(f"--ttl must be from {MIN_TTL_S:g}s to 24h, not {ttl_s:g}s")
    if name == DEFAULT_POOL:
        chosen = provider or get_settings().primary_provider
    else:
        policy = policy_named(name)
        if policy is None:
            raise PlacementUnknownError(f"no placement policy is named {name!r}; create it "
                                        f"with `playrun placement set` or use {DEFAULT_POOL!r}")
        if provider not in (None, policy.provider):
            raise PoolInvalidError(f"pool {name!r} keeps sandboxes of its policy's primary "
                                   f"provider {policy.provider!r}, not {str(provider)[:40]!r}")
        chosen = policy.provider
    if chosen not in PROVIDER_NAMES:
        raise PoolInvalidError(f"unknown provider {str(chosen)[:40]!r}")
    return Pool(name, str(chosen), low, high, float(ttl_s))


def set_pool(pool: Pool) -> Pool:
    """Create or replace a pool; a smaller --max or --ttl retires what it no longer keeps
    at the next tick (hygiene.py)."""
    assert pool.max_ready <= MAX_SQL_INT
    with session_scope() as session:
        row = session.get(WarmPool, pool.name, with_for_update=True)
        if row is None:
            row = WarmPool(name=pool.name)
            session.add(row)
        elif row.provider != pool.provider:
            # Members of the old provider are no use to the new one.
            _retire_all(session, pool.name, "its pool moved to another provider")
        row.provider = pool.provider
        row.min_ready = pool.min_ready
        row.max_ready = pool.max_ready
        row.ttl_s = pool.ttl_s
        row.updated_at = db_now()
    return pool


def remove_pool(name: Any) -> int:
    """Remove a pool; its warm sandboxes are retired (deleted by the next refill task).
    Returns how many were retired."""
    name = check_pool_name(name)
    with session_scope() as session:
        row = session.get(WarmPool, name, with_for_update=True)
        if row is None:
            raise PoolUnknownError(f"no warm pool is named {name!r}")
        session.delete(row)
        return _retire_all(session, name, "its pool was removed")


def _retire_all(session: Any, name: str, why: str) -> int:
    done = session.execute(sa.update(PoolMember).where(
        PoolMember.pool == name,
        PoolMember.state.in_((PoolMemberState.CREATING, PoolMemberState.READY)),
    ).values(state=PoolMemberState.RETIRING, last_error=why))
    return int(done.rowcount or 0)


def pools() -> list[Pool]:
    with session_scope(readonly=True) as session:
        rows = session.scalars(sa.select(WarmPool).order_by(WarmPool.name)).all()
        return [Pool(r.name, r.provider, r.min_ready, r.max_ready, float(r.ttl_s)) for r in rows]


def pool_named(name: str) -> Pool | None:
    with session_scope(readonly=True) as session:
        row = session.get(WarmPool, name)
        if row is None:
            return None
        return Pool(row.name, row.provider, row.min_ready, row.max_ready, float(row.ttl_s))
