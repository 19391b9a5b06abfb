"""`heartbeat`: the runner is alive; renew its lease, and tell it whether to stop.

Renewals are batched in time: the lease is written only when less than
`heartbeat_timeout_s - renew_every` of it is left, so a running play costs at most
one commit per `renew_every` seconds however often it beats. The fence and the cancel
flag are read on every beat.
"""

from __future__ import annotations

from typing import Any, Literal

import sqlalchemy as sa

from models import Attempt, Run, db_now
from tasks.constants import TERMINAL_STATUSES
from tasks.db import session_scope
from tasks.errors import FenceLostError
from tasks.fence import launch_filter
from tasks.gateway.actions.base import ActionRequest, Context, launch_of
from tasks.gateway.tokens import Grant

# At most one lease write per this many seconds per running play (<= 0.1 commits/s).
RENEW_EVERY_S = 10.0


class Heartbeat(ActionRequest):
    action: Literal["heartbeat"]


def renew_every(timeout_s: float) -> float:
    return min(RENEW_EVERY_S, timeout_s / 3)


def handle(grant: Grant, _request: Heartbeat, ctx: Context) -> dict[str, Any]:
    fence = launch_of(grant)
    timeout = ctx.settings.heartbeat_timeout_s
    with session_scope() as session:
        row = session.execute(
            sa.select(Run.status, Run.cancel_requested_at.is_not(None),
                      sa.func.coalesce(Attempt.runner_deadline < db_now(), False))
            .join(Attempt, Attempt.run_id == Run.id).where(launch_filter(fence))).first()
        if row is None or row[0] in TERMINAL_STATUSES:
            raise FenceLostError(f"launch {grant.launch_id} of run {grant.run_id} is not current")
        if row[2]:
            # Past the run's time limit: no more lease; it stops, the reaper inspects it.
            return {"cancel": True, "renewed": False, "reason": "past the run's time limit",
                    "interval_s": ctx.settings.heartbeat_interval_s}
        renewed = session.execute(
            sa.update(Attempt)
            .where(launch_filter(fence),
                   Attempt.lease_expires_at < db_now(timeout - renew_every(timeout)))
            .values(lease_expires_at=db_now(timeout), last_heartbeat_at=db_now(),
                    unreachable_at=None)
        ).rowcount  # type: ignore[attr-defined]
    return {"cancel": bool(row[1]), "renewed": bool(renewed),
            "interval_s": ctx.settings.heartbeat_interval_s}
