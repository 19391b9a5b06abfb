"""The reaper: recover attempts whose lease expired, and finish releases that failed.

An attempt whose worker vanished is adopted under a fresh lease token (the old
worker, if only slow, loses its fence): after launch its runner is watched again;
before launch nothing of the customer's ran, so the start is deferred and retried.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from models import Attempt, CapacityLease, Run, RuntimeResource, db_now
from tasks import ledger
from tasks.acquisition.capacity import HELD, RELEASED, RESERVED
from tasks.constants import (
    ATTEMPT_ACTIVE,
    EV_CAPACITY_RELEASED,
    RESOURCE_DELETED,
    TASK_WATCH_ATTEMPT,
    TERMINAL_STATUSES,
)
from tasks.db import session_scope
from tasks.fence import Fence, lock_run
from tasks.release.attempt import release_attempt
from tasks.settings import Settings

log = logging.getLogger("playrun.reaper")


@dataclass
class ReapReport:
    reservations_expired: int = 0
    adopted_watch: list[str] = field(default_factory=list)
    adopted_precode: list[str] = field(default_factory=list)
    releases_retried: int = 0


def expire_reservations() -> int:
    """Reservations that never went live give their slot back.

    Each one locks its run row first, the order every fenced write takes (a promotion holds
    the run and then updates the lease); the ledger insert's foreign-key check needs a share
    lock on the run, so updating the lease first could deadlock against that promotion.
    """
    with session_scope() as session:
        due = session.execute(
            sa.select(CapacityLease.id, CapacityLease.run_id)
            .where(CapacityLease.state == RESERVED, CapacityLease.expires_at < db_now())
        ).all()
    expired = 0
    for lease_id, run_id in due:
        with session_scope() as session:
            lock_run(session, run_id)
            row = session.execute(
                sa.update(CapacityLease)
                .where(CapacityLease.id == lease_id, CapacityLease.state == RESERVED,
                       CapacityLease.expires_at < db_now())
                .values(state=RELEASED, released_at=db_now())
                .returning(CapacityLease.generation)
            ).first()
            if row is not None:
                ledger.append(session, run_id, EV_CAPACITY_RELEASED,
                              {"lease_id": lease_id, "reason": "reservation expired"}, row[0])
                expired += 1
    return expired


def _adopt(run_id: str, settings: Settings) -> tuple[Fence, bool] | None:
    """Take over an expired attempt with a new token; True if its runner was launched."""
    with session_scope() as session:
        run = lock_run(session, run_id)
        if run is None or run.status in TERMINAL_STATUSES:
            return None
        attempt = session.scalars(sa.select(Attempt).where(
            Attempt.run_id == run_id, Attempt.generation == run.current_generation,
            Attempt.state == ATTEMPT_ACTIVE, Attempt.lease_expires_at < db_now())).first()
        if attempt is None:
            return None
        attempt.lease_token = secrets.token_hex(16)
        attempt.lease_expires_at = db_now(settings.lease_seconds)
        attempt.worker_id = "reaper"
        return (Fence(run_id, attempt.generation, attempt.lease_token),
                attempt.runner_started_at is not None)


def recover_expired(settings: Settings, app: Any, report: ReapReport) -> None:
    from tasks.acquisition.deferral import defer

    with session_scope() as session:
        run_ids = list(session.scalars(
            sa.select(Attempt.run_id).join(Run, Run.id == Attempt.run_id).where(
                Attempt.state == ATTEMPT_ACTIVE, Attempt.lease_expires_at < db_now(),
                Attempt.generation == Run.current_generation).limit(200)))
    for run_id in run_ids:
        adopted = _adopt(run_id, settings)
        if adopted is None:
            continue
        fence, launched = adopted
        if launched:
            app.send_task(TASK_WATCH_ATTEMPT, args=[fence.run_id, fence.generation,
                                                    fence.lease_token])
            report.adopted_watch.append(run_id)
        else:
            defer(fence, "worker_lost", settings, app,
                  detail="the worker starting this attempt stopped before the runner launched")
            report.adopted_precode.append(run_id)


def retry_releases(report: ReapReport) -> None:
    """Sandboxes and leases of ended attempts that an earlier release left behind."""
    with session_scope() as session:
        stale = sa.select(Attempt.run_id, Attempt.generation).where(
            Attempt.state != ATTEMPT_ACTIVE, Attempt.state != "deferred")
        pairs = set(session.execute(
            sa.select(RuntimeResource.run_id, RuntimeResource.generation).where(
                RuntimeResource.state != RESOURCE_DELETED,
                sa.tuple_(RuntimeResource.run_id, RuntimeResource.generation).in_(stale))
        ).all())
        pairs |= set(session.execute(
            sa.select(CapacityLease.run_id, CapacityLease.generation).where(
                CapacityLease.state.in_(HELD),
                sa.tuple_(CapacityLease.run_id, CapacityLease.generation).in_(stale))
        ).all())
    for run_id, generation in pairs:
        release_attempt(run_id, generation)
        report.releases_retried += 1


def reap(settings: Settings, app: Any) -> ReapReport:
    report = ReapReport()
    report.reservations_expired = expire_reservations()
    recover_expired(settings, app, report)
    retry_releases(report)
    return report
