"""`complete`: the runner's terminal result, settled first-write-wins at once.

Once a terminal is written the attempt's token is dead like every other: a repeat (the
runner retrying its own push) or a replay answers FENCE_LOST and learns nothing of the run.

The release (sandbox delete, capacity, receipts) is handed to a Celery task on the
queue that reaches the sandbox (releases.py groups those of one window); a request
never deletes a sandbox itself.
"""

from __future__ import annotations

from typing import Any, Literal

from tasks.constants import RELEASE_QUEUE
from tasks.errors import FenceLostError
from tasks.gateway import refusals
from tasks.gateway.actions.base import ActionRequest, Context, launch_of
from tasks.security.tokens import Grant
from tasks.settlement.outcome import Outcome, from_document
from tasks.settlement.terminal import PUSHED_REASON, Settled, settle_launch


class Complete(ActionRequest):
    action: Literal["complete"]
    result: dict[str, Any]


def settle(grant: Grant, outcome: Outcome, ctx: Context, *,
           reason: str = PUSHED_REASON) -> Settled:
    """Settle the attempt's run and queue its release if this write won."""
    flush = ctx.refusals.settling((grant.run_id, grant.generation))
    if flush is not None:  # before the terminal: after it the fence holds no more
        refusals.record(grant, flush)
    settled = settle_launch(launch_of(grant), outcome, reason=reason)
    if settled.won:
        ctx.releases.add((grant.run_id, grant.generation, settled.holder_token or ""),
                         settled.host_queue or RELEASE_QUEUE, settled.sandbox)
    return settled


def handle(grant: Grant, request: Complete, ctx: Context) -> dict[str, Any]:
    settled = settle(grant, from_document(request.result), ctx)
    if not settled.won:  # a terminal or a cancel decided the run: this token is spent
        raise FenceLostError(f"launch {grant.launch_id} no longer holds its attempt")
    outcome = settled.outcome
    return {"won": True, "status": outcome.status, "code": outcome.code}
