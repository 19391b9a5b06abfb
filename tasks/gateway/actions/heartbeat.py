"""`heartbeat`: the runner is alive; renew its lease, and tell it whether to stop.

Beats are answered in batches (tasks/gateway/beats.py): one transaction per window for
all of them, and the lease is written only when less than `heartbeat_timeout_s -
renew_every` of it is left, so a running play costs a fraction of a commit per beat.
"""

from __future__ import annotations

from typing import Any, Literal

from tasks.errors import FenceLostError
from tasks.gateway.actions.base import ActionRequest, Context, launch_of
from tasks.security.tokens import Grant


class Heartbeat(ActionRequest):
    action: Literal["heartbeat"]


async def handle(grant: Grant, _request: Heartbeat, ctx: Context) -> dict[str, Any]:
    # Awaited on the event loop: a thousand waiting beats hold no threads.
    answer = await ctx.beats.beat_async(launch_of(grant))
    if answer is None:
        raise FenceLostError(f"launch {grant.launch_id} of run {grant.run_id} is not current")
    if answer.past_deadline:
        return {"cancel": True, "renewed": False, "reason": "past the run's time limit",
                "interval_s": ctx.settings.heartbeat_interval_s}
    return {"cancel": answer.cancel, "renewed": answer.renewed,
            "interval_s": ctx.settings.heartbeat_interval_s}
