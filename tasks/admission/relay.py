"""The outbox relay: publish due rows with the row id as the Celery task id.

Rows are claimed with FOR UPDATE SKIP LOCKED on PostgreSQL (SQLite's BEGIN
IMMEDIATE serialises the claim), so concurrent relays never publish a row twice
in one pass; a crash between publish and commit re-publishes it, and the claim
in start_attempt makes that duplicate harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
import sqlalchemy.orm

from models import Outbox, Run, db_now
from tasks.constants import QUEUE, QUEUED
from tasks.db import is_postgres, session_scope

log = logging.getLogger("playrun.relay")


def _publish(app: Any, rows: Sequence[Outbox]) -> int:
    published = 0
    for row in rows:
        try:
            app.send_task(row.task_name, args=list(row.args), task_id=row.id, queue=QUEUE,
                          ignore_result=True)
        except Exception as exc:  # noqa: BLE001 - any broker error: the sweep tries again
            log.warning("outbox %s not published: %s", row.id, exc)
            break
        row.sent_at = db_now()
        row.publish_count = (row.publish_count or 0) + 1
        published += 1
    return published


def publish_admitted(app: Any, outbox_id: str, task_name: str, args: list[Any]) -> bool:
    """The fast path right after submit commits: publish, then mark the row sent.

    Marking is not worth an fsync: if it is lost, the sweep publishes a duplicate,
    which the claim ignores. A broker error leaves the row to the sweep.
    """
    try:
        # No result subscription: outcomes live in SQL, and subscribing to a Redis that
        # is down retries for about 20 s before the publish is even tried.
        app.send_task(task_name, args=args, task_id=outbox_id, queue=QUEUE, ignore_result=True)
    except Exception as exc:  # noqa: BLE001 - any broker error: the sweep tries again
        log.warning("outbox %s left to the sweep: %s", outbox_id, exc)
        return False
    with session_scope() as session:
        if is_postgres(session):
            session.execute(sa.text("SET LOCAL synchronous_commit = off"))
        session.execute(sa.update(Outbox).where(Outbox.id == outbox_id,
                                                Outbox.sent_at.is_(None))
                        .values(sent_at=db_now(), publish_count=Outbox.publish_count + 1))
    return True


def publish_due(app: Any, *, ids: Sequence[str] | None = None, limit: int = 200) -> int:
    """Publish unsent rows that are due. Broker errors leave rows unsent for the next sweep."""
    with session_scope() as session:
        stmt = (
            sa.select(Outbox)
            .where(Outbox.sent_at.is_(None), Outbox.available_at <= db_now())
            .order_by(Outbox.available_at)
            .limit(limit)
        )
        if ids is not None:
            stmt = stmt.where(Outbox.id.in_(list(ids)))
        if is_postgres(session):
            stmt = stmt.with_for_update(skip_locked=True)
        return _publish(app, list(session.scalars(stmt)))


def resend_stale(app: Any, *, after_s: float, limit: int = 200) -> int:
    """Re-publish the start of runs still queued long after it was sent.

    A broker that lost its messages (a Redis restart) must not strand a run. The
    wait doubles with each resend so a long but healthy backlog is not flooded.
    """
    newer = sa.orm.aliased(Outbox)
    with session_scope() as session:
        # Doubling per resend, capped at 2**6; CASE reads the same on both backends.
        exponent = sa.case((Outbox.publish_count > 6, 6), else_=Outbox.publish_count)
        backoff = after_s * sa.func.power(2, exponent)
        stmt = (
            sa.select(Outbox)
            .join(Run, Run.id == Outbox.run_id)
            .where(
                Run.status == QUEUED,
                Outbox.sent_at.is_not(None),
                Outbox.sent_at < db_now(-backoff),
                # Only the newest row of a run matters; older ones were for earlier deferrals.
                ~sa.exists().where(newer.run_id == Outbox.run_id,
                                   newer.created_at > Outbox.created_at),
            )
            .order_by(Outbox.sent_at)
            .limit(limit)
        )
        if is_postgres(session):
            stmt = stmt.with_for_update(of=Outbox, skip_locked=True)
        return _publish(app, list(session.scalars(stmt)))
