"""What `playrun pool show`, the dashboard and the metrics exporter say of each pool."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from models import PoolMember
from tasks.acquisition.pools import stats
from tasks.acquisition.pools.config import pools
from tasks.constants import PoolMemberState
from tasks.store.db import session_scope


def states() -> dict[str, dict[str, int]]:
    """Per pool: ready, refilling (being created), claiming (claimed, its standby not yet
    started on the run), retiring."""
    with session_scope(readonly=True) as session:
        undelivered = PoolMember.delivered_at.is_(None)
        rows = session.execute(
            sa.select(PoolMember.pool, PoolMember.state, undelivered, sa.func.count())
            .where(PoolMember.state != PoolMemberState.GONE)
            .group_by(PoolMember.pool, PoolMember.state, undelivered)).all()
    out: dict[str, dict[str, int]] = {}
    for pool, state, not_yet, n in rows:
        counts = out.setdefault(pool, {"ready": 0, "refilling": 0, "claiming": 0,
                                       "retiring": 0})
        if state == PoolMemberState.READY:
            counts["ready"] += int(n)
        elif state == PoolMemberState.CREATING:
            counts["refilling"] += int(n)
        elif state == PoolMemberState.RETIRING:
            counts["retiring"] += int(n)
        elif state == PoolMemberState.CLAIMED and not_yet:
            counts["claiming"] += int(n)
    return out


def show() -> list[dict[str, Any]]:
    known = pools()
    now = states()
    counters = stats.counters([p.name for p in known])
    out = []
    for pool in known:
        counts = now.get(pool.name, {"ready": 0, "refilling": 0, "claiming": 0, "retiring": 0})
        c = counters[pool.name]
        asked = c["claims"] + c["misses"]
        out.append({**pool.as_dict(), **counts, **c,
                    "hit_rate": round(c["claims"] / asked, 4) if asked else None})
    return out
