"""`standby`: a warm sandbox's runner asks for its assignment (tasks/acquisition/pools/).

Its token names a pool member, not a run, and can do nothing else. While the member is
ready the call is held (up to PLAYRUN_POOL_STANDBY_WAIT_S) and its last call recorded, so
a standby that goes silent is replaced; once an attempt has claimed it (claim and launch
record are one transaction) the answer is the run's play, input and the launch's own
tokens. An attempt that ended first, or a retired member, is told to stop.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from models import Attempt, PlayBundle, PoolMember, Run, db_now
from tasks.constants import AttemptState, PoolMemberState, RunStatus
from tasks.execution.launch import runner_env
from tasks.gateway.actions.base import ActionRequest, Context
from tasks.security.tokens import Grant
from tasks.settings import Settings
from tasks.store.db import session_scope
from tasks.store.fence import Fence


class Standby(ActionRequest):
    action: Literal["standby"]
    wait_s: float = Field(default=0.0, ge=0.0, le=60.0)


_STOP = {"assigned": False, "stop": True, "reason": "this warm sandbox is retired"}


def look(member_id: str, settings: Settings) -> dict[str, Any] | None:
    """The answer for the member now; None while it is ready and unclaimed."""
    with session_scope(durable=False) as session:
        # Unclaimed (the common answer): its call is recorded, not flushed to disk.
        seen = session.execute(sa.update(PoolMember).where(
            PoolMember.id == member_id, PoolMember.state.in_(
                (PoolMemberState.READY, PoolMemberState.CREATING)),
        ).values(seen_at=db_now()).returning(PoolMember.id)).first()
    if seen is not None:
        return None
    return _deliver(member_id, settings)


def _deliver(member_id: str, settings: Settings) -> dict[str, Any] | None:
    """A claimed member's assignment, marked delivered (durably: from here the play may
    run, so the attempt is never withdrawn and started again elsewhere); None while it is
    unclaimed."""
    with session_scope() as session:
        row = session.execute(sa.select(
            PoolMember, Run.org_id, Run.input, Run.status, Run.current_generation,
            PlayBundle.source, Attempt.launch_id, Attempt.lease_token, Attempt.state,
            sa.select(db_now()).scalar_subquery(),
        ).outerjoin(Run, Run.id == PoolMember.run_id).outerjoin(
            Attempt, sa.and_(Attempt.run_id == PoolMember.run_id,
                             Attempt.generation == PoolMember.generation)).outerjoin(
            PlayBundle, PlayBundle.digest == Run.play_digest).where(
            PoolMember.id == member_id).with_for_update(of=PoolMember)).first()
        if row is None or row[0].state in (PoolMemberState.RETIRING, PoolMemberState.GONE):
            return _STOP
        member = row[0]
        if member.state != PoolMemberState.CLAIMED:
            return None
        if (row.status != RunStatus.RUNNING or row.launch_id is None
                or row.state != AttemptState.ACTIVE or row.current_generation != member.generation):
            return {"assigned": False, "stop": True,
                    "reason": "the attempt that claimed this sandbox ended before it started"}
        if member.delivered_at is None:
            member.delivered_at = db_now()
        fence = Fence(str(member.run_id), int(member.generation or 0), row.lease_token)
        provider = member.provider
        now = row[-1]
    env = runner_env(fence, row.org_id, row.launch_id, settings, now.timestamp(), provider)
    return {"assigned": True, "env": env, "play": row.source, "input": row.input,
            "timeout_s": settings.run_timeout_s}


async def handle(grant: Grant, request: Standby, ctx: Context) -> dict[str, Any]:
    member_id = grant.run_id
    deadline = time.monotonic() + min(request.wait_s, ctx.settings.pool_standby_wait_s)
    answer = await run_in_threadpool(look, member_id, ctx.settings)
    while answer is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return {"assigned": False}
        # Woken by its claim: straight to the assignment; else look again (and be seen).
        woken = await ctx.wakeups.wait(member_id, left)
        answer = await run_in_threadpool(_deliver if woken else look, member_id, ctx.settings)
    return answer
