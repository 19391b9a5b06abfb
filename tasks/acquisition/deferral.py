"""Durable, bounded deferral of a pre-code failure.

The attempt keeps its generation (state `deferred`), no worker slot waits, and
the next start is an outbox row due at `now + delay`: published with a Celery
countdown when short, or by the beat sweep when longer than any countdown we allow.
"""

from __future__ import annotations

import enum
import logging
from typing import Literal

import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import Attempt, Outbox, Run, db_now
from tasks.acquisition.backoff import budget_exhausted, deferral_delay_ms, pacing_delay_ms
from tasks.acquisition.fairshare import relay as fair_relay
from tasks.admission.rows import start_args
from tasks.admission.submit import enqueue_start
from tasks.broker.app import start_queue
from tasks.broker.publish import publisher
from tasks.constants import (
    START_DEFERRAL_EXHAUSTED,
    TASK_START_ATTEMPT,
    AttemptState,
    EventKind,
    RunStatus,
    StartOrder,
)
from tasks.observe import metrics
from tasks.release.attempt import release_attempt
from tasks.release.sandboxes import release_sandboxes
from tasks.settings import Settings
from tasks.settlement.outcome import CANCELLED_OUTCOME, Outcome
from tasks.settlement.terminal import write_terminal
from tasks.store import ledger
from tasks.store.db import session_scope
from tasks.store.fence import Fence, hold
from tasks.store.notify import run_settled

log = logging.getLogger("playrun.deferral")

Cause = Literal["hold", "throttle", "provider_capacity", "provider_rate_limited", "transport",
                "capacity", "worker_lost", "placement"]


PACING = frozenset({"throttle", "provider_rate_limited"})


class Verdict(enum.StrEnum):
    """What a deferral did with the attempt."""

    DEFERRED = "deferred"  # parked for a later start
    EXHAUSTED = "exhausted"  # the budget was spent: the run failed
    CANCELLED = "cancelled"  # a cancel arrived first


def defer(fence: Fence, cause: Cause, settings: Settings, *,
          at_least_ms: int = 0, detail: str = "", provider: str | None = None) -> Verdict:
    """Schedule the attempt again later, or fail the run once the budget is spent.
    `provider`: the queue of the provider the next start is placed on.

    A cancel that arrived during acquisition wins over waiting for another try.
    """
    if _cancel_requested(fence.run_id):
        # The sandbox goes before the final `cancelled` write below (docs/design.md).
        release_sandboxes(fence.run_id, fence.generation, fence.lease_token)
    outbox_id, delay = None, 0
    with session_scope() as session:
        run, attempt = hold(session, fence)
        if run.cancel_requested_at is not None:
            _end(session, run, attempt, fence, CANCELLED_OUTCOME, "cancelled")
            verdict = Verdict.CANCELLED
        else:
            # A wait for the start rate (ours, or the provider's 429) is pacing, not a
            # failure: the run comes back when a permit can be due, with jitter, neither
            # backing off nor spending its count (the time budget still bounds it).
            pacing = cause in PACING
            if pacing:
                delay = pacing_delay_ms(at_least_ms or settings.deferral_base_ms)
            else:
                delay = deferral_delay_ms(run.deferral_count, base_ms=settings.deferral_base_ms,
                                          max_ms=settings.deferral_max_ms,
                                          at_least_ms=at_least_ms)
            if budget_exhausted(0 if pacing else run.deferral_count, run.deferral_total_ms, delay,
                                max_count=settings.deferral_max_count,
                                max_total_ms=int(settings.deferral_max_total_s * 1000)):
                message = (f"sandbox start deferred {run.deferral_count} times over "
                           f"{run.deferral_total_ms / 1000:.1f}s; last cause: {cause}"
                           + (f" ({detail})" if detail else ""))
                _end(session, run, attempt, fence,
                     Outcome.failed(START_DEFERRAL_EXHAUSTED, message), "deferral_exhausted")
                verdict = Verdict.EXHAUSTED
            else:
                outbox_id = _park(session, run, attempt, fence, cause, delay, detail,
                                  provider, counted=not pacing)
                verdict = Verdict.DEFERRED
    if verdict is Verdict.DEFERRED:
        metrics.deferred(cause)  # committed: counted once per scheduled wait
    release_attempt(fence.run_id, fence.generation, fence.lease_token)
    if verdict is not Verdict.DEFERRED:
        run_settled(fence.run_id,
                    RunStatus.FAILED if verdict is Verdict.EXHAUSTED else RunStatus.CANCELLED)
    elif outbox_id is not None and settings.start_order == StartOrder.FAIR:
        fair_relay.note_backlog()  # the row waits in the outbox for its org's turn once due
    elif outbox_id is not None and delay / 1000 <= settings.max_countdown_s:
        _publish_with_countdown(outbox_id, start_args(fence.run_id, provider), delay / 1000)
    return verdict


def _cancel_requested(run_id: str) -> bool:
    with session_scope(readonly=True) as session:
        return bool(session.scalar(sa.select(Run.cancel_requested_at.is_not(None)).where(
            Run.id == run_id)))


def _end(session: Session, run: Run, attempt: Attempt, fence: Fence, outcome: Outcome,
         reason: str) -> None:
    attempt.state = AttemptState.ENDED
    attempt.end_reason = reason
    attempt.ended_at = db_now()
    write_terminal(session, run, outcome, fence.generation)


def _park(session: Session, run: Run, attempt: Attempt, fence: Fence, cause: Cause,
          delay: int, detail: str, provider: str | None, *, counted: bool = True) -> str:
    """The attempt waits (same generation); the next start is an outbox row due later."""
    attempt.state = AttemptState.DEFERRED
    attempt.lease_expires_at = db_now()
    # A runner launched before the wait (its launch timed out, a standby never took the
    # run) must not pass the launch fence once the attempt resumes under the same generation.
    attempt.launch_id = None
    run.status = RunStatus.QUEUED
    run.deferred_until = db_now(delay / 1000)
    run.deferral_count += 1 if counted else 0
    run.deferral_total_ms += delay
    run.last_deferral_cause = cause
    ledger.append(session, fence.run_id, EventKind.DEFERRED,
                  {"cause": cause, "delay_ms": delay, "detail": detail or None},
                  fence.generation)
    return enqueue_start(session, fence.run_id, run.org_id, delay_s=delay / 1000,
                         provider=provider, place=run.created_at)


def _publish_with_countdown(outbox_id: str, args: list[str], countdown: float) -> None:
    """Short waits ride a Celery countdown; if the broker is down the sweep publishes later."""
    run_id = args[0]
    try:
        publisher().send(TASK_START_ATTEMPT, args, task_id=outbox_id, queue=start_queue(args),
                         countdown=countdown)
    except Exception as exc:  # noqa: BLE001 - any broker error: the sweep publishes it
        log.warning("deferred start of run %s left to the sweep: %s", run_id, exc)
        return
    with session_scope() as session:
        session.execute(sa.update(Outbox).where(Outbox.id == outbox_id).values(
            sent_at=db_now(), publish_count=Outbox.publish_count + 1))
