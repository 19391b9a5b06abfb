"""What a worker restarted under the same node name takes back from its previous life.

A killed worker's claimed attempts that never launched wait out their lease (20 s by
default) before the reaper adopts them. A node that starts again knows its previous life
is over, so it ends those leases at once and the next reaper pass retries them (nothing
of the customer's ran: their launch was never recorded). A launched attempt is never
touched: its runner does not need its worker. Were two live workers given one node name,
the fence would still keep the other one's attempt from launching twice.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa

from models import Attempt, db_now
from tasks.constants import ATTEMPT_ACTIVE
from tasks.db import session_scope
from tasks.fence import lock_run

log = logging.getLogger("playrun.restart")

BATCH = 200


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def end_previous_leases(node: str, limit: int = BATCH) -> list[str]:
    """End the leases of unlaunched attempts a previous life of `node` claimed; returns
    their run ids. Called before this life has claimed anything."""
    owned = Attempt.worker_id.like(_escaped(node) + ":%", escape="\\")
    with session_scope(readonly=True) as session:
        run_ids = list(session.scalars(
            sa.select(Attempt.run_id).where(owned, Attempt.state == ATTEMPT_ACTIVE,
                                            Attempt.runner_started_at.is_(None))
            .limit(limit)))
    ended = []
    for run_id in run_ids:
        with session_scope() as session:
            lock_run(session, run_id)  # the run row first, as every writer takes them
            changed = session.execute(
                sa.update(Attempt).where(
                    Attempt.run_id == run_id, owned, Attempt.state == ATTEMPT_ACTIVE,
                    Attempt.runner_started_at.is_(None), Attempt.lease_expires_at > db_now())
                .values(lease_expires_at=db_now())).rowcount  # type: ignore[attr-defined]
        if changed:
            ended.append(run_id)
    return ended
