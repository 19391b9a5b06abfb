"""`exited`: a sandbox's supervisor (a cloud sandbox's boot script) says that the runner's
process ended.

Only the supervisor's own token sends it (run.exit and nothing else, scoped to one launch;
the play never sees it). After the runner's `complete` it changes nothing. Before, the
host of the sandbox is asked at once for the inspection a heartbeat timeout would start
(tasks/worker/jobs.py): a result the runner left is settled, a malformed one fails
OUTPUT_INVALID, none RUNTIME_RUNNER_LOST, under the same fence as ever. What the report
says of the exit is only logged: the inspection reads the sandbox itself.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import Field, StrictBool

from models import Attempt, Run
from tasks.constants import QUEUE, TASK_INSPECT_ATTEMPT, TERMINAL_STATUSES, AttemptState
from tasks.gateway.actions.base import ActionRequest, Context
from tasks.security.tokens import Grant
from tasks.store.db import session_scope

log = logging.getLogger("playrun.gateway.exited")


class Exited(ActionRequest):
    action: Literal["exited"]
    status: int | None = Field(default=None, ge=0, le=255)  # None: ended by a signal
    signal: int | None = Field(default=None, ge=1, le=255)
    result_present: StrictBool = False


def _live_holder(grant: Grant) -> tuple[str, str | None] | None:
    """(lease token, host queue) of the launch's attempt while it is open, else None."""
    with session_scope(readonly=True) as session:
        row = session.execute(
            sa.select(Attempt.lease_token, Attempt.host_queue)
            .join(Run, Run.id == Attempt.run_id)
            .where(Attempt.run_id == grant.run_id, Attempt.generation == grant.generation,
                   Attempt.launch_id == grant.launch_id, Attempt.state == AttemptState.ACTIVE,
                   Run.current_generation == grant.generation,
                   Run.status.not_in(TERMINAL_STATUSES))).first()
    return (row[0], row[1]) if row is not None else None


def handle(grant: Grant, request: Exited, ctx: Context) -> dict[str, Any]:
    holder = _live_holder(grant)
    if holder is None:  # completed, settled or superseded: the report is late news
        return {"inspecting": False}
    token, host_queue = holder
    log.info("run %s gen %s: runner exited (status %s, signal %s, result %s); inspecting",
             grant.run_id, grant.generation, request.status, request.signal,
             "present" if request.result_present else "absent")
    # A failed send answers 500: the supervisor retries, and the heartbeat timeout remains.
    ctx.send(TASK_INSPECT_ATTEMPT, [grant.run_id, grant.generation, token, True],
             host_queue or QUEUE)
    return {"inspecting": True}
