"""The reaper: recover attempts whose lease expired, and finish releases that failed.

An attempt whose worker vanished is adopted under a fresh lease token (the old
worker, if only slow, loses its fence): after launch its runner is watched again;
before launch nothing of the customer's ran, so the start is deferred and retried.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field

import sqlalchemy as sa

from models import Attempt, CapacityLease, Run, RuntimeResource, db_now
from tasks.acquisition.capacity import HELD, RELEASED, RESERVED
from tasks.acquisition.deferral import defer
from tasks.broker.publish import send
from tasks.constants import (
    QUEUE,
    RELEASE_QUEUE,
    RUNTIME_RUNNER_LOST,
    TASK_CANCEL_ATTEMPT,
    TASK_INSPECT_ATTEMPT,
    TASK_RELEASE_ATTEMPT,
    TERMINAL_STATUSES,
    AttemptState,
    EventKind,
    SandboxState,
)
from tasks.maintenance.trouble import note_failure
from tasks.release.attempt import release_attempt
from tasks.release.receipts import release_orphans
from tasks.sandbox.runtime import host_queue
from tasks.settings import Settings
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle_forced
from tasks.store import ledger
from tasks.store.db import session_scope
from tasks.store.fence import Fence, lock_run

log = logging.getLogger("playrun.reaper")

# Rows each step of a pass looks at: the next pass takes the rest, so a pass costs the
# same whatever the backlog (the partial indexes of migration 0006 keep each read small).
BATCH = 200


@dataclass
class ReapReport:
    reservations_expired: int = 0
    adopted_watch: list[str] = field(default_factory=list)
    adopted_precode: list[str] = field(default_factory=list)
    settled_overdue: list[str] = field(default_factory=list)
    releases_retried: int = 0
    receipts_released: int = 0


def expire_reservations(limit: int = BATCH) -> int:
    """Reservations that never went live give their slot back.

    Each one locks its run row first, the order every fenced write takes (a promotion holds
    the run and then updates the lease); the ledger insert's foreign-key check needs a share
    lock on the run, so updating the lease first could deadlock against that promotion.
    """
    with session_scope() as session:
        due = session.execute(
            sa.select(CapacityLease.id, CapacityLease.run_id)
            .where(CapacityLease.state == RESERVED, CapacityLease.expires_at < db_now())
            .order_by(CapacityLease.expires_at).limit(limit)
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
                ledger.append(session, run_id, EventKind.CAPACITY_RELEASED,
                              {"lease_id": lease_id, "reason": "reservation expired"}, row[0])
                expired += 1
    return expired


@dataclass(frozen=True)
class Adopted:
    fence: Fence
    launched: bool
    overdue: bool  # far past the runner's deadline: no inspection has been able to settle it
    host_queue: str | None


def _adopt(run_id: str, settings: Settings) -> Adopted | None:
    """Take over an expired attempt under a new token; its rows move to the new holder."""
    with session_scope() as session:
        run = lock_run(session, run_id)
        if run is None or run.status in TERMINAL_STATUSES:
            return None
        attempt = session.scalars(sa.select(Attempt).where(
            Attempt.run_id == run_id, Attempt.generation == run.current_generation,
            Attempt.state == AttemptState.ACTIVE, Attempt.lease_expires_at < db_now())).first()
        if attempt is None:
            return None
        old, new = attempt.lease_token, secrets.token_hex(16)
        overdue = bool(session.scalar(sa.select(
            Attempt.runner_deadline < db_now(-2 * settings.lease_seconds)
        ).where(Attempt.id == attempt.id)))
        attempt.lease_token = new
        # A launched runner gets one heartbeat timeout for its inspection to conclude.
        attempt.lease_expires_at = db_now(settings.heartbeat_timeout_s
                                          if attempt.runner_started_at is not None
                                          else settings.lease_seconds)
        attempt.worker_id = "reaper"
        for model in (RuntimeResource, CapacityLease):
            session.execute(sa.update(model).where(
                model.run_id == run_id, model.generation == attempt.generation,
                model.holder_token == old).values(holder_token=new))
        return Adopted(Fence(run_id, attempt.generation, new),
                       attempt.runner_started_at is not None, overdue, attempt.host_queue)


def _recover(adopted: Adopted, settings: Settings, report: ReapReport) -> None:
    fence = adopted.fence
    queue = adopted.host_queue or QUEUE
    if not adopted.launched:
        # Nothing of the customer's ran: deferring (and so retrying) is safe.
        defer(fence, "worker_lost", settings,
              detail="the worker starting this attempt stopped before the runner launched")
        report.adopted_precode.append(fence.run_id)
    elif adopted.overdue:
        # A backstop for a runner nobody can inspect (its host gone, say): the host's
        # queue deletes the sandbox when it is back.
        settled = settle_forced(fence.run_id, Outcome.failed(
            RUNTIME_RUNNER_LOST, "the runner passed its deadline and its sandbox could not "
            "be inspected"), "runner_lost")
        if settled.won:
            send(TASK_RELEASE_ATTEMPT, [fence.run_id, fence.generation, fence.lease_token],
                 adopted.host_queue or RELEASE_QUEUE)
        report.settled_overdue.append(fence.run_id)
    else:
        # Its heartbeats stopped: the host that holds the sandbox inspects it.
        send(TASK_INSPECT_ATTEMPT, [fence.run_id, fence.generation, fence.lease_token], queue)
        report.adopted_watch.append(fence.run_id)


def resend_cancels(settings: Settings) -> int:
    """A cancel whose task was lost (a broker restart) is sent again to the sandbox's host."""
    with session_scope(readonly=True) as session:
        rows = session.execute(
            sa.select(Attempt.run_id, Attempt.host_queue).join(Run, Run.id == Attempt.run_id)
            .where(Attempt.state == AttemptState.ACTIVE,
                   Attempt.generation == Run.current_generation,
                   Attempt.runner_started_at.is_not(None),
                   # Implied by the active attempt; lets the run's status index drive.
                   Run.status.not_in(TERMINAL_STATUSES),
                   Run.cancel_requested_at < db_now(-settings.heartbeat_timeout_s))
            .limit(BATCH)).all()
    for run_id, queue in rows:
        send(TASK_CANCEL_ATTEMPT, [run_id], queue or QUEUE)
    return len(rows)


def recover_expired(settings: Settings, report: ReapReport) -> None:
    with session_scope(readonly=True) as session:
        run_ids = list(session.scalars(
            sa.select(Attempt.run_id).join(Run, Run.id == Attempt.run_id).where(
                Attempt.state == AttemptState.ACTIVE, Attempt.lease_expires_at < db_now(),
                Attempt.generation == Run.current_generation).limit(BATCH)))
    for run_id in run_ids:
        try:
            adopted = _adopt(run_id, settings)
            if adopted is not None:
                _recover(adopted, settings, report)
        except Exception as exc:  # noqa: BLE001 - one run's trouble must not stop the pass
            # The next pass tries again, a bounded number of times (trouble.py).
            note_failure(run_id, exc, "the reaper's recovery")


def retry_releases(report: ReapReport, grace_s: float = 0.0, limit: int = BATCH) -> None:
    """Sandboxes and leases whose holder is no longer the active attempt's holder, a batch
    at a time, once their attempt ended `grace_s` ago (its own release task is usually
    still on its way before that)."""
    current = sa.select(Attempt.run_id, Attempt.generation, Attempt.lease_token).where(
        Attempt.state == AttemptState.ACTIVE)
    found: set[tuple[str, int, str]] = set()
    with session_scope(readonly=True) as session:
        for model, held in ((RuntimeResource, RuntimeResource.state != SandboxState.DELETED),
                            (CapacityLease, CapacityLease.state.in_(HELD))):
            holder = sa.func.coalesce(model.holder_token, "")
            settled_a_while = sa.or_(Attempt.ended_at.is_(None),
                                     Attempt.ended_at < db_now(-grace_s))
            for run_id, generation, token in session.execute(
                sa.select(model.run_id, model.generation, holder)
                .outerjoin(Attempt, sa.and_(Attempt.run_id == model.run_id,
                                            Attempt.generation == model.generation))
                .where(held, settled_a_while,
                       sa.tuple_(model.run_id, model.generation, holder).not_in(current))
                .limit(limit)
            ).all():
                found.add((run_id, generation, token))
    here = host_queue()
    with session_scope(readonly=True) as session:
        hosts = {(r, g): q for r, g, q in session.execute(
            sa.select(Attempt.run_id, Attempt.generation, Attempt.host_queue)
            .where(Attempt.host_queue.is_not(None),
                   Attempt.run_id.in_({run_id for run_id, _, _ in found}))).all()} \
            if found else {}
    for run_id, generation, token in found:
        queue = hosts.get((run_id, generation))
        if queue is not None and queue != here:
            send(TASK_RELEASE_ATTEMPT, [run_id, generation, token], queue)  # its host deletes
        else:
            release_attempt(run_id, generation, token)
        report.releases_retried += 1


def reap(settings: Settings) -> ReapReport:
    report = ReapReport()
    report.reservations_expired = expire_reservations()
    recover_expired(settings, report)
    resend_cancels(settings)
    retry_releases(report, settings.release_grace_s)
    report.receipts_released = release_orphans()
    return report
