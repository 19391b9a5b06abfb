"""The outbox relay: publish start messages with the outbox row id as the Celery task id.

A row is claimed by marking it sent in a short transaction; the publish happens after
that commit, so no lock (SQLite's write lock above all) is held while the broker is
slow, and two relays never publish one row in one pass (FOR UPDATE SKIP LOCKED on
PostgreSQL, BEGIN IMMEDIATE on SQLite). A publish that fails un-marks its rows for
the next sweep; a process that dies between the mark and the publish leaves a run
that is still queued long after "sent", which resend_stale publishes again. Every
duplicate is harmless: the claim in start_attempt decides.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
import sqlalchemy.orm

from models import Outbox, Run, db_now
from tasks.broker.publish import Message, publisher

__all__ = ["Message", "publish", "publish_admitted", "publish_due", "resend_stale", "unmark"]
from tasks.constants import RunStatus
from tasks.store.db import is_postgres, session_scope

log = logging.getLogger("playrun.relay")



def publish(messages: Sequence[Message]) -> bool:
    """Send every message in one pipeline; False on any broker error (nothing is lost:
    the caller un-marks the rows for the sweep)."""
    try:
        publisher().send_many(messages)
    except Exception as exc:  # noqa: BLE001 - any broker error: the sweep tries again
        log.warning("%d start message(s) left to the sweep: %s", len(messages), exc)
        return False
    return True


def unmark(ids: Sequence[str]) -> None:
    """Give rows whose publish failed back to the next sweep (best effort)."""
    try:
        with session_scope() as session:
            session.execute(sa.update(Outbox).where(Outbox.id.in_(list(ids)))
                            .values(sent_at=None, publish_count=Outbox.publish_count - 1))
    except Exception as exc:  # noqa: BLE001 - resend_stale still finds them
        log.warning("outbox rows not un-marked (%s); the resend will publish them", exc)


def publish_admitted(messages: Sequence[Message]) -> bool:
    """Right after admission commits: its rows were written already marked sent."""
    if publish(messages):
        return True
    unmark([task_id for task_id, _, _ in messages])
    return False


def _claim_and_publish(chosen: sa.Select[Any]) -> int:
    """Mark the chosen rows sent (one UPDATE ... RETURNING), commit, then publish."""
    with session_scope() as session:
        if is_postgres(session):
            chosen = chosen.with_for_update(of=Outbox, skip_locked=True)
        claimed = session.execute(
            sa.update(Outbox).where(Outbox.id.in_(chosen.scalar_subquery()))
            .values(sent_at=db_now(), publish_count=Outbox.publish_count + 1)
            .returning(Outbox.id, Outbox.task_name, Outbox.args, Outbox.available_at)
        ).all()
    messages = [(row.id, row.task_name, list(row.args))
                for row in sorted(claimed, key=lambda r: r.available_at)]
    if publish(messages):
        return len(messages)
    unmark([m[0] for m in messages])
    return 0


def publish_due(*, ids: Sequence[str] | None = None, limit: int = 200,
                without_org: bool = False) -> int:
    """Publish up to `limit` unsent rows that are due; returns how many were published.

    `without_org`: only rows written before fair order knew their org (the fair relay
    publishes the rest)."""
    stmt = (sa.select(Outbox.id)
            .where(Outbox.sent_at.is_(None), Outbox.available_at <= db_now())
            .order_by(Outbox.available_at).limit(limit))
    if without_org:
        stmt = stmt.where(Outbox.org_id.is_(None))
    if ids is not None:
        stmt = stmt.where(Outbox.id.in_(list(ids)))
    return _claim_and_publish(stmt)


def _requeue(chosen: sa.Select[Any]) -> int:
    """Fair order: give the chosen rows back to the outbox, unsent, in their org's place."""
    with session_scope() as session:
        if is_postgres(session):
            chosen = chosen.with_for_update(of=Outbox, skip_locked=True)
        return len(session.execute(
            sa.update(Outbox).where(Outbox.id.in_(chosen.scalar_subquery()),
                                    Outbox.org_id.is_not(None))
            .values(sent_at=None).returning(Outbox.id)).all())


def resend_stale(*, after_s: float, limit: int = 200, requeue: bool = False) -> int:
    """Re-publish the start of runs still queued long after it was sent.

    A broker that lost its messages (a Redis restart) must not strand a run, nor may a
    submitter that died before its publish. A healthy backlog is not flooded: the broker
    hands out starts oldest first, so only a run sent before the oldest start still
    waiting there can have lost its message (or be held by a worker that died); the
    others wait their turn. The wait also doubles with each resend. With `requeue` (fair order) rows
    that know their org go back to the outbox unsent, for the fair relay to publish in
    their org's turn, in their place.
    """
    newer = sa.orm.aliased(Outbox)
    # Doubling per resend, capped at 2**6; CASE reads the same on both backends.
    exponent = sa.case((Outbox.publish_count > 6, 6), else_=Outbox.publish_count)
    backoff = after_s * sa.func.power(2, exponent)
    stmt = (
        sa.select(Outbox.id)
        .join(Run, Run.id == Outbox.run_id)
        .where(
            Run.status == RunStatus.QUEUED,
            Outbox.sent_at.is_not(None),
            Outbox.sent_at < db_now(-backoff),
            # Only the newest row of a run matters; older ones were for earlier deferrals.
            ~sa.exists().where(newer.run_id == Outbox.run_id,
                               newer.created_at > Outbox.created_at),
        )
        # Oldest queued runs first: the partial index on queued runs' created_at drives
        # the walk, so the cost follows the queue, not the history of sent rows.
        .order_by(Run.created_at)
        .limit(limit)
    )
    oldest = publisher().oldest_waiting()
    if oldest is not None:  # unknown to this database (another's message): no bound
        waiting = sa.orm.aliased(Outbox)  # not the outer row: no correlation
        waiting_since = sa.select(waiting.sent_at).where(waiting.id == oldest) \
            .scalar_subquery()
        stmt = stmt.where(Outbox.sent_at < sa.func.coalesce(waiting_since, db_now()))
    if requeue:
        return _requeue(stmt) + _claim_and_publish(stmt.where(Outbox.org_id.is_(None)))
    return _claim_and_publish(stmt)
