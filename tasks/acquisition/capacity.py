"""Capacity leases (SPEC 4.4): reserve under a per-org lock, promote by CAS, release once.

Reservations lock the org's row in `capacity_orgs` (FOR UPDATE on PostgreSQL;
SQLite's BEGIN IMMEDIATE serialises writers), so concurrent workers count and
insert one at a time and live + reserved can never pass the limit in `enforce`.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from models import CapacityLease, CapacityOrg, db_now
from tasks import ledger
from tasks.admission.validate import check_count, check_org_id
from tasks.constants import (
    CAPACITY_EXCEEDED_MESSAGE,
    EV_CAPACITY_OVERRUN,
    LEASE_HELD,
    LEASE_LIVE,
    LEASE_RELEASED,
    LEASE_RESERVED,
)
from tasks.db import is_postgres, session_scope
from tasks.errors import CapacityExceededError, FenceLostError
from tasks.fence import Fence
from tasks.settings import Settings

RESERVED = LEASE_RESERVED
LIVE = LEASE_LIVE
RELEASED = LEASE_RELEASED
HELD = LEASE_HELD


@dataclass(frozen=True)
class Reservation:
    lease_id: str
    overrun: bool
    in_use: int
    limit: int


def _lock_org(session: Session, org_id: str) -> CapacityOrg:
    insert = pg_insert if is_postgres(session) else sqlite_insert
    session.execute(insert(CapacityOrg).values(org_id=org_id)
                    .on_conflict_do_nothing(index_elements=["org_id"]))
    stmt = sa.select(CapacityOrg).where(CapacityOrg.org_id == org_id)
    if is_postgres(session):
        stmt = stmt.with_for_update()
    org = session.scalars(stmt.execution_options(populate_existing=True)).one()
    return org


def limit_for(session: Session, org_id: str, default: int) -> int:
    value = session.scalar(sa.select(CapacityOrg.limit).where(CapacityOrg.org_id == org_id))
    return default if value is None else value


def in_use(session: Session, org_id: str) -> int:
    return int(session.scalar(sa.select(sa.func.count()).where(
        CapacityLease.org_id == org_id, CapacityLease.state.in_(HELD))) or 0)


def reserve(session: Session, fence: Fence, org_id: str, settings: Settings) -> Reservation:
    """Take a slot for this attempt inside the caller's fenced transaction.

    Raises CapacityExceededError in `enforce` mode when the org is full; in
    `observe` mode admits and records the overrun in the ledger.
    """
    org = _lock_org(session, org_id)
    limit = settings.org_capacity if org.limit is None else org.limit
    used = in_use(session, org_id)
    overrun = used >= limit
    if overrun and settings.capacity_mode == "enforce":
        raise CapacityExceededError(CAPACITY_EXCEEDED_MESSAGE)
    lease = CapacityLease(
        org_id=org_id, run_id=fence.run_id, generation=fence.generation, state=RESERVED,
        holder_token=fence.lease_token, overrun=overrun,
        expires_at=db_now(settings.capacity_reservation_ttl_s),
    )
    session.add(lease)
    session.flush()
    if overrun:
        ledger.append(session, fence.run_id, EV_CAPACITY_OVERRUN,
                      {"lease_id": lease.id, "in_use": used, "limit": limit}, fence.generation)
    return Reservation(lease.id, overrun, used + 1, limit)


def promote(session: Session, fence: Fence, lease_id: str, provider: str,
            sandbox_id: str) -> None:
    """reserved -> live as a compare-and-set, inside the caller's fenced transaction.

    Finding the lease already live is success only for the same sandbox of the same
    attempt (a provider retry re-reports it); anything else is a fence loss.
    """
    changed = session.execute(
        sa.update(CapacityLease)
        .where(CapacityLease.id == lease_id, CapacityLease.run_id == fence.run_id,
               CapacityLease.generation == fence.generation, CapacityLease.state == RESERVED)
        .values(state=LIVE, provider=provider, sandbox_id=sandbox_id, live_at=db_now(),
                expires_at=None)
    ).rowcount  # type: ignore[attr-defined]
    if changed == 1:
        return
    lease = session.get(CapacityLease, lease_id, populate_existing=True)
    if (lease is not None and lease.state == LIVE and lease.run_id == fence.run_id
            and lease.generation == fence.generation and lease.sandbox_id == sandbox_id
            and lease.provider == provider):
        return
    state = "missing" if lease is None else lease.state
    raise FenceLostError(f"capacity lease {lease_id} is {state}, not reserved for this attempt")


def set_limit(org_id: str, limit: int | None) -> None:
    """An operator override of ORG's limit (None removes it); checked before it is stored."""
    org_id = check_org_id(org_id)
    if limit is not None:
        limit = check_count(limit, "the capacity limit")
    with session_scope() as session:
        org = _lock_org(session, org_id)
        org.limit = limit
        org.updated_at = db_now()


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
