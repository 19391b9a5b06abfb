"""`playrun submit`: fail fast when Redis does not answer, hint when no worker does, and
show the run's progress while waiting (on a terminal)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from tasks.cli.output import console, live_status, redact_url
from tasks.constants import CLI_BROKER_TIMEOUT_S, CLI_NO_WORKER_HINT_S, EventKind
from tasks.errors import BrokerUnavailableError, RunWaitTimeoutError

# Each check for news waits at most this long for the run's Redis notification.
_POLL_S = 0.5


def bound_publishing() -> None:
    """A CLI process is a person waiting: bounded connects, reads and retries when it
    publishes (a worker keeps Celery's patient defaults)."""
    from tasks.broker.app import app

    app.conf.broker_transport_options = {
        **(app.conf.broker_transport_options or {}),
        "socket_connect_timeout": CLI_BROKER_TIMEOUT_S,
        "socket_timeout": CLI_BROKER_TIMEOUT_S,
    }
    app.conf.broker_connection_timeout = CLI_BROKER_TIMEOUT_S
    app.conf.task_publish_retry_policy = {"max_retries": 1, "interval_start": 0,
                                          "interval_step": 0.2, "interval_max": 0.2}
    # The relay's own warning would repeat, less clearly, the line submit prints.
    logging.getLogger("playrun.relay").setLevel(logging.ERROR)
    logging.getLogger("playrun.fair").setLevel(logging.ERROR)


def submit(play: Path, input: Any, org: str, key: str | None) -> Any:
    import tasks
    from tasks.settings import get_settings

    bound_publishing()
    handle = tasks.submit_run(play, input, org_id=org, idempotency_key=key)
    if not handle.published:
        raise BrokerUnavailableError(
            f"the broker at {redact_url(get_settings().celery_broker_url)} did not answer; "
            f"run {handle.id} is committed and `celery -A tasks beat` (its outbox sweep) "
            f"sends it once the broker answers")
    return handle


def wait(handle: Any, timeout_s: float) -> Any:
    """The run's result; a live status line on a terminal, and one hint on stderr when no
    worker has started an attempt after a few seconds (the wait goes on)."""
    import tasks
    from tasks.settings import get_settings

    err = console(stderr=True)
    started = time.monotonic()
    deadline = started + timeout_s
    hinted = False
    with live_status(err, f"run {handle.id}: submitted") as status:
        while True:
            left = deadline - time.monotonic()
            try:
                return handle.wait(timeout=max(0.0, min(_POLL_S, left)))
            except RunWaitTimeoutError:
                if left <= _POLL_S:
                    raise RunWaitTimeoutError(
                        f"run {handle.id} is still {tasks.get_run(handle.id).status} after "
                        f"{timeout_s:g}s") from None
            events = tasks.run_events(handle.id)
            elapsed = time.monotonic() - started
            status.update(f"run {handle.id}: {events[-1].kind if events else 'submitted'} "
                          f"({len(events)} events, {elapsed:.0f} s)")
            if not hinted and elapsed >= CLI_NO_WORKER_HINT_S and \
                    not any(e.kind == EventKind.ATTEMPT_STARTED for e in events):
                hinted = True
                err.print(f"no worker has started run {handle.id} after {elapsed:.0f} s: is "
                          f"`celery -A tasks worker` running on "
                          f"{redact_url(get_settings().celery_broker_url)}? Still waiting.",
                          markup=False)
