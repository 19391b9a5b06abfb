"""Beat's pass over warm pools, in the database only: retire members past their time to
live, members whose standby runner went silent, creates that never finished, members of
removed pools and the surplus over a smaller --max; then say which refills to ask for.
Deleting the retired sandboxes is the refill task's (refill.py), on a worker that reaches
them."""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from models import PoolMember, WarmPool, db_now
from tasks.acquisition.pools import stats
from tasks.constants import PoolMemberState
from tasks.settings import Settings
from tasks.store.db import session_scope

# A create (and its standby's start) that has not reported ready by then never will.
CREATING_MAX_S = 300.0
# Silent for this many of the gateway's standby waits: the standby runner is gone.
SILENT_WAITS = 3
# Claimed and gone members are kept this long for `pool show` and debugging.
HISTORY_S = 3600.0


@dataclass
class TickReport:
    retired: dict[str, int] = field(default_factory=dict)  # why -> count
    # (pool, provider, host) that need a refill task: short of min, or retired to delete.
    refills: list[tuple[str, str, str]] = field(default_factory=list)


_READY = PoolMember.state == PoolMemberState.READY


def _retire(report: TickReport, why: str, *where: sa.ColumnElement[bool]) -> None:
    with session_scope() as session:
        rows = session.execute(sa.update(PoolMember).where(*where).values(
            state=PoolMemberState.RETIRING, last_error=why,
        ).returning(PoolMember.pool).execution_options(synchronize_session=False)).all()
    if rows:
        report.retired[why] = report.retired.get(why, 0) + len(rows)
        by_pool: dict[str, int] = {}
        for (pool,) in rows:
            by_pool[pool] = by_pool.get(pool, 0) + 1
        for pool, n in by_pool.items():
            stats.count(pool, "expiries" if why == "expired" else "retired", n)


def tick(settings: Settings) -> TickReport:
    report = TickReport()
    with session_scope(readonly=True) as session:
        pools = {p.name: p for p in session.scalars(sa.select(WarmPool)).all()}
        # A fleet without pools (the default) pays one read a tick, no writes.
        if not pools and not session.scalar(sa.select(sa.exists().where(
                PoolMember.id.is_not(None)))):
            return report
    _retire(report, "expired", _READY, PoolMember.expires_at <= db_now())
    _retire(report, "silent", _READY,
            PoolMember.seen_at < db_now(-SILENT_WAITS * settings.pool_standby_wait_s))
    _retire(report, "never ready", PoolMember.state == PoolMemberState.CREATING,
            PoolMember.created_at < db_now(-CREATING_MAX_S))
    _retire(report, "pool removed",
            PoolMember.state.in_((PoolMemberState.CREATING, PoolMemberState.READY)),
            PoolMember.pool.not_in(list(pools)) if pools else sa.true())
    _trim_surplus(report, pools)
    with session_scope() as session:
        session.execute(sa.delete(PoolMember).where(
            PoolMember.state.in_((PoolMemberState.GONE, PoolMemberState.CLAIMED)),
            sa.func.coalesce(PoolMember.claimed_at, PoolMember.created_at)
            < db_now(-HISTORY_S)))
        rows = session.execute(sa.select(
            PoolMember.pool, PoolMember.provider, PoolMember.host, PoolMember.state,
            sa.func.count()).where(PoolMember.state.in_((
                PoolMemberState.CREATING, PoolMemberState.READY, PoolMemberState.RETIRING)))
            .group_by(PoolMember.pool, PoolMember.provider, PoolMember.host,
                      PoolMember.state)).all()
    kept: dict[tuple[str, str, str], int] = {}
    wanted: set[tuple[str, str, str]] = set()
    for name, provider, host, state, n in rows:
        if state == PoolMemberState.RETIRING:
            wanted.add((name, provider, host))
        else:
            kept[(name, provider, host)] = kept.get((name, provider, host), 0) + int(n)
    for key, n in kept.items():
        found = pools.get(key[0])
        if found is not None and n < found.min_ready:
            wanted.add(key)
    with session_scope(readonly=True) as session:
        hosts = session.execute(sa.select(PoolMember.provider, PoolMember.host).distinct()
                                .where(PoolMember.host != "")).all()
    # A pool short anywhere else (no member yet, or a new host): its provider's workers
    # look, and each host that ever kept one of its provider's members.
    for name, row in pools.items():
        if row.min_ready:
            wanted.add((name, row.provider, ""))
            wanted.update((name, row.provider, host) for provider, host in hosts
                          if provider == row.provider)
    report.refills = sorted(wanted)
    return report


def _trim_surplus(report: TickReport, pools: dict[str, WarmPool]) -> None:
    """Ready members over a pool's --max on a host: the oldest go first."""
    with session_scope(readonly=True) as session:
        counts = session.execute(sa.select(PoolMember.pool, PoolMember.host, sa.func.count())
                                 .where(_READY).group_by(PoolMember.pool, PoolMember.host)).all()
    for name, host, n in counts:
        pool = pools.get(name)
        if pool is None or n <= pool.max_ready:
            continue
        with session_scope(readonly=True) as session:
            oldest = [r[0] for r in session.execute(sa.select(PoolMember.id).where(
                _READY, PoolMember.pool == name, PoolMember.host == host,
            ).order_by(PoolMember.ready_at).limit(int(n) - pool.max_ready)).all()]
        if oldest:
            _retire(report, "surplus", _READY, PoolMember.id.in_(oldest))
