"""The Celery tasks: thin shells over the life-of-a-run modules."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from tasks.acquisition.claim import seconds_until_due
from tasks.acquisition.start import start
from tasks.admission.relay import publish_due, resend_stale
from tasks.app import app
from tasks.constants import (
    QUEUE,
    TASK_REAP,
    TASK_RELAY_OUTBOX,
    TASK_SANDBOX_GC,
    TASK_START_ATTEMPT,
    TASK_SWEEP_OUTBOX,
    TASK_WATCH_ATTEMPT,
    TASK_WATCHDOG_PING,
)
from tasks.execution.watch import watch
from tasks.fence import Fence
from tasks.maintenance.gc import collect
from tasks.maintenance.reaper import reap
from tasks.runtime import provider
from tasks.settings import get_settings

log = logging.getLogger("playrun.jobs")


@app.task(name=TASK_START_ATTEMPT, bind=True, max_retries=None)
def start_attempt(self: Task, run_id: str) -> str:
    settings = get_settings()
    outcome = start(run_id, settings, app)
    if outcome == "locked":
        # Another worker holds the run row right now; look again shortly.
        raise self.retry(countdown=1)
    if outcome == "not_due":
        # Early by the worker's clock (the DB clock decides): come back when it is due,
        # or leave it to the sweep if that is further off than any countdown we allow.
        left = seconds_until_due(run_id)
        if left is not None and left <= settings.max_countdown_s:
            raise self.retry(countdown=max(left, 0.0) + 0.05)
    if outcome == "launched":
        from tasks.execution.watch import current_fence

        fence = current_fence(run_id)
        if fence is not None:
            _watch(fence, settings.watch_inline_s)
    log.info("start_attempt %s: %s", run_id, outcome)
    return outcome


def _watch(fence: Fence, inline_s: float) -> str:
    settings = get_settings()
    from tasks.runtime import provider as provider_for

    result = watch(fence, provider_for(), settings, inline_s)
    if result == "again":
        watch_attempt.apply_async(
            args=[fence.run_id, fence.generation, fence.lease_token],
            countdown=min(settings.watch_interval_s, settings.max_countdown_s), queue=QUEUE,
        )
    return result


@app.task(name=TASK_WATCH_ATTEMPT)
def watch_attempt(run_id: str, generation: int, lease_token: str) -> str:
    return _watch(Fence(run_id, generation, lease_token), get_settings().watch_inline_s)


@app.task(name=TASK_WATCHDOG_PING, ignore_result=True)
def watchdog_ping() -> None:
    """Received is what counts (see tasks.maintenance.watchdog); running it is a no-op."""


@app.task(name=TASK_RELAY_OUTBOX)
def relay_outbox(ids: list[str] | None = None) -> int:
    return publish_due(app, ids=ids)


@app.task(name=TASK_SWEEP_OUTBOX)
def sweep_outbox() -> int:
    settings = get_settings()
    return publish_due(app) + resend_stale(app, after_s=settings.outbox_resend_after_s)


@app.task(name=TASK_REAP)
def reap_attempts() -> dict[str, Any]:
    report = reap(get_settings(), app)
    return report.__dict__


@app.task(name=TASK_SANDBOX_GC)
def sandbox_gc() -> dict[str, Any]:
    settings = get_settings()
    report = collect([provider()], settings.gc_grace_s)
    return report.__dict__
