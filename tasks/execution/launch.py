"""Launch the runner detached, after recording the suspension under the fence.

The launch is recorded *before* exec: if the worker dies in between, the reaper
treats the attempt as launched and watches or inspects it, never retries it, so a
play can never run twice. At worst a runner that never started is reported lost.
"""

from __future__ import annotations

from typing import Literal

from models import db_now
from tasks.constants import RUNNER_FILE
from tasks.db import session_scope
from tasks.fence import Fence, hold, renew
from tasks.sandbox import SandboxProvider
from tasks.settings import Settings

# The supervisor's hard kill comes this long after the runner's own timeout fires.
HARD_KILL_GRACE_S = 5.0


def mark_launching(fence: Fence, settings: Settings) -> Literal["go", "cancelled"]:
    """Fenced: record the launch and its deadline, unless a cancel arrived first."""
    with session_scope() as session:
        run, attempt = hold(session, fence)
        if run.cancel_requested_at is not None:
            return "cancelled"
        attempt.runner_started_at = db_now()
        # Past this the runner is lost whatever the sandbox says.
        attempt.runner_deadline = db_now(
            settings.run_timeout_s + HARD_KILL_GRACE_S + settings.heartbeat_grace_s
        )
        renew(session, fence, settings.lease_seconds)
    return "go"


def launch(fence: Fence, provider: SandboxProvider, sandbox_id: str, org_id: str,
           settings: Settings) -> None:
    provider.exec_detached(
        sandbox_id,
        ["{python}", RUNNER_FILE, "--timeout", f"{settings.run_timeout_s:g}"],
        env={
            "PLAYRUN_RUN_ID": fence.run_id,
            "PLAYRUN_GENERATION": str(fence.generation),
            "PLAYRUN_ORG_ID": org_id,
        },
        timeout_s=settings.run_timeout_s + HARD_KILL_GRACE_S,
    )
