"""Capacity leases (docs/design.md): reserve under a per-org lock, promote by CAS, release once.

Reservations lock the org's row in `capacity_orgs` (an upsert that takes the row
lock and returns the limit; SQLite's BEGIN IMMEDIATE serialises writers anyway), so
concurrent workers count and insert one at a time and live + reserved can never pass
the limit in `enforce`. On PostgreSQL lock, count and insert are one call of the
function `playrun_capacity_reserve` (migration 0008), whose statements each take a fresh
snapshot, so the count follows the lock and sees every committed lease.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from models import CapacityLease, CapacityOrg, db_now, new_id
from tasks.constants import (
    CAPACITY_EXCEEDED_MESSAGE,
    FAIR_WEIGHT_DEFAULT,
    LEASE_HELD,
    EventKind,
    LeaseState,
)
from tasks.errors import CapacityExceededError, FenceLostError
from tasks.parse.checks import check_count, check_org_id, check_weight
from tasks.settings import Settings
from tasks.store import ledger
from tasks.store.db import is_postgres, session_scope
from tasks.store.fence import HELD_SQL, Fence, fence_params, hold

RESERVED = LeaseState.RESERVED
LIVE = LeaseState.LIVE
RELEASED = LeaseState.RELEASED
HELD = LEASE_HELD


@dataclass(frozen=True)
class Reservation:
    lease_id: str
    overrun: bool
    in_use: int
    limit: int


_PG_LOCK_ORG = """
INSERT INTO capacity_orgs (org_id) VALUES (%(org)s)
ON CONFLICT (org_id) DO UPDATE SET org_id = excluded.org_id
RETURNING "limit"
"""


def _lock_org(session: Session, org_id: str) -> int | None:
    """Lock the org's row (created on first use) and return its limit override.

    A no-op DO UPDATE: unlike DO NOTHING it locks an existing row, and it returns it.
    """
    if is_postgres(session):
        session.flush()  # raw statements follow the caller's pending writes
        value = session.connection().exec_driver_sql(_PG_LOCK_ORG, {"org": org_id}).scalar()
        return None if value is None else int(value)
    stmt = sqlite_insert(CapacityOrg).values(org_id=org_id)
    stmt = stmt.on_conflict_do_update(index_elements=["org_id"],
                                      set_={"org_id": stmt.excluded.org_id})
    return session.execute(stmt.returning(CapacityOrg.limit)).scalar_one()


def limit_for(session: Session, org_id: str, default: int) -> int:
    value = session.scalar(sa.select(CapacityOrg.limit).where(CapacityOrg.org_id == org_id))
    return default if value is None else value


def _held(org_id: str) -> sa.ColumnElement[bool]:
    return sa.and_(CapacityLease.org_id == org_id, CapacityLease.state.in_(HELD))


def in_use(session: Session, org_id: str) -> int:
    return int(session.scalar(sa.select(sa.func.count()).where(_held(org_id))) or 0)


# One statement: the fence, then (per held row, so only when the fence holds) the
# migration's function locks the org row and counts and inserts after the lock; an
# overrun is recorded in the ledger by the same statement.
_PG_RESERVE = f"""
WITH held AS ({HELD_SQL}), res AS (
    SELECT f.used, f.lease_id, f.cap FROM held, LATERAL playrun_capacity_reserve(
        %(org)s, %(id)s, held.id, %(gen)s::integer, %(token)s, %(default)s::integer,
        %(observe)s, %(ttl)s) AS f
), overrun AS (
    INSERT INTO run_events (run_id, generation, kind, data)
    SELECT %(run)s, %(gen)s, '{EventKind.CAPACITY_OVERRUN}', jsonb_build_object(
        'lease_id', res.lease_id, 'in_use', res.used, 'limit', res.cap)
    FROM res WHERE res.lease_id IS NOT NULL AND res.used >= res.cap
)
SELECT used, lease_id, cap FROM res
"""


def reserve(session: Session, fence: Fence, org_id: str, settings: Settings, *,
            default: int | None = None, observe: bool | None = None) -> Reservation:
    """Take a slot for this attempt in the caller's transaction; the fence is checked here.

    Raises CapacityExceededError in `enforce` mode when the org is full; in
    `observe` mode admits and records the overrun in the ledger.
    """
    if observe is None:
        observe = settings.capacity_mode != "enforce"
    if default is None:
        default = settings.org_capacity
    lease_id = new_id()
    if is_postgres(session):
        session.flush()  # the raw statement follows the caller's pending writes
        row = session.connection().exec_driver_sql(_PG_RESERVE, {
            **fence_params(fence), "org": org_id, "id": lease_id,
            "default": default, "observe": observe,
            "ttl": float(settings.capacity_reservation_ttl_s)}).first()
        if row is None:
            hold(session, fence)  # raises, saying which part of the fence failed
            raise FenceLostError(f"attempt {fence.generation} of run {fence.run_id} "
                                 "lost its fence before reserving capacity")
        used, inserted, limit = int(row[0]), row[1], int(row[2])
    else:
        hold(session, fence)
        override = _lock_org(session, org_id)
        limit = default if override is None else override
        used = in_use(session, org_id)
        inserted = None
        if used < limit or observe:
            session.execute(sa.insert(CapacityLease).values(
                id=lease_id, org_id=org_id, run_id=fence.run_id, generation=fence.generation,
                state=RESERVED, holder_token=fence.lease_token, overrun=used >= limit,
                expires_at=db_now(settings.capacity_reservation_ttl_s)))
            inserted = lease_id
            if used >= limit:
                ledger.append(session, fence.run_id, EventKind.CAPACITY_OVERRUN,
                              {"lease_id": lease_id, "in_use": used, "limit": limit},
                              fence.generation)
    if inserted is None:
        raise CapacityExceededError(CAPACITY_EXCEEDED_MESSAGE)
    return Reservation(lease_id, used >= limit, used + 1, limit)


# One statement that checks the fence itself, so a caller needs no hold() for it.
_PG_PROMOTE = f"""
WITH held AS ({HELD_SQL}), moved AS (
    UPDATE capacity_leases AS l SET state = '{LIVE}', provider = %(provider)s,
        sandbox_id = %(sandbox)s, live_at = clock_timestamp(), expires_at = NULL
    FROM held
    WHERE l.id = %(lease)s AND l.run_id = held.id AND l.generation = %(gen)s
      AND l.state = '{RESERVED}'
    RETURNING l.id
)
SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM moved)
"""

# Built once and run on the connection: no ORM bookkeeping for a one-row CAS.
_PROMOTE = (
    sa.update(CapacityLease)
    .where(CapacityLease.id == sa.bindparam("b_lease_id"),
           CapacityLease.run_id == sa.bindparam("b_run_id"),
           CapacityLease.generation == sa.bindparam("b_generation"),
           CapacityLease.state == RESERVED)
    .values(state=LIVE, provider=sa.bindparam("b_provider"),
            sandbox_id=sa.bindparam("b_sandbox_id"), live_at=db_now(), expires_at=None)
)


def promote(session: Session, fence: Fence, lease_id: str, provider: str,
            sandbox_id: str) -> None:
    """reserved -> live as a compare-and-set in the caller's transaction, fenced here.

    Finding the lease already live is success only for the same sandbox of the same
    attempt (a provider retry re-reports it); anything else is a fence loss.
    """
    if is_postgres(session):
        # No flush: the statement reads nothing the caller may have pending, and the
        # caller's attempt changes then go out as one UPDATE at commit.
        held, changed = session.connection().exec_driver_sql(_PG_PROMOTE, {
            **fence_params(fence), "lease": lease_id, "provider": provider,
            "sandbox": sandbox_id}).one()
        if not held:
            hold(session, fence)  # raises, saying which part of the fence failed
            raise FenceLostError(f"attempt {fence.generation} of run {fence.run_id} "
                                 "lost its fence before its lease went live")
    else:
        hold(session, fence)
        changed = session.connection().execute(_PROMOTE, {
            "b_lease_id": lease_id, "b_run_id": fence.run_id,
            "b_generation": fence.generation, "b_provider": provider,
            "b_sandbox_id": sandbox_id}).rowcount
    if changed == 1:
        return
    lease = session.get(CapacityLease, lease_id, populate_existing=True)
    if (lease is not None and lease.state == LIVE and lease.run_id == fence.run_id
            and lease.generation == fence.generation and lease.sandbox_id == sandbox_id
            and lease.provider == provider):
        return
    state = "missing" if lease is None else lease.state
    raise FenceLostError(f"capacity lease {lease_id} is {state}, not reserved for this attempt")


# `~` is outside every org id, so no tenant can share a pool's pseudo-org.
POOL_PREFIX = "~provider:"


def pool_for(provider: str) -> str:
    """The pseudo-org whose leases count a provider's live sandboxes fleet-wide."""
    return f"{POOL_PREFIX}{provider}"


def reserve_pool(session: Session, fence: Fence, provider: str, max_live: int,
                 settings: Settings, org_lease_id: str | None) -> str | None:
    """A slot among the provider's `max_live` after the org's, in the same transaction and
    under the same kind of lock, so the provider is never asked for more. None when full:
    the org's slot taken just before is given back in this transaction."""
    try:
        return reserve(session, fence, pool_for(provider), settings, default=max_live,
                       observe=False).lease_id
    except CapacityExceededError:
        if org_lease_id is not None:
            session.execute(sa.delete(CapacityLease).where(CapacityLease.id == org_lease_id))
        return None


def promote_pool(session: Session, fence: Fence, provider: str, sandbox_id: str) -> None:
    """The provider pool's lease goes live with the org's (same transaction, same fence)."""
    session.execute(sa.update(CapacityLease).where(
        CapacityLease.run_id == fence.run_id, CapacityLease.generation == fence.generation,
        CapacityLease.org_id == pool_for(provider), CapacityLease.state == RESERVED,
    ).values(state=LIVE, provider=provider, sandbox_id=sandbox_id, live_at=db_now(),
             expires_at=None))


def set_limit(org_id: str, limit: int | None, weight: int | None = None) -> None:
    """An operator override of ORG's limit (None removes it) and, if given, its weight in
    the fair order of starts; both checked before either is stored."""
    org_id = check_org_id(org_id)
    if limit is not None:
        limit = check_count(limit, "the capacity limit")
    values: dict[str, Any] = {"limit": limit, "updated_at": db_now()}
    if weight is not None:
        values["weight"] = check_weight(weight)
    with session_scope() as session:
        _lock_org(session, org_id)
        session.execute(sa.update(CapacityOrg).where(CapacityOrg.org_id == org_id)
                        .values(**values))


def weights() -> dict[str, int]:
    """Every org's weight that is not the default."""
    with session_scope(readonly=True) as session:
        return {org: int(w) for org, w in session.execute(
            sa.select(CapacityOrg.org_id, CapacityOrg.weight)
            .where(CapacityOrg.weight != FAIR_WEIGHT_DEFAULT))}


def show(default: int) -> list[tuple[str, int, int, int]]:
    """(org, limit, reserved, live) for every org with an override or a held lease."""
    with session_scope(readonly=True) as session:
        orgs = set(session.scalars(sa.select(CapacityOrg.org_id)))
        counts: dict[tuple[str, str], int] = {}
        for org, state, n in session.execute(
            sa.select(CapacityLease.org_id, CapacityLease.state, sa.func.count())
            .where(CapacityLease.state.in_(HELD))
            .group_by(CapacityLease.org_id, CapacityLease.state)
        ):
            counts[(org, state)] = n
            orgs.add(org)
        return [(org, limit_for(session, org, default), counts.get((org, RESERVED), 0),
                 counts.get((org, LIVE), 0)) for org in sorted(orgs)]
