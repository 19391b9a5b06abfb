"""Start messages a worker holds, so a killed worker's are sent again when it restarts.

A worker prefetches start messages; killed with SIGKILL, it leaves them unacked in
Redis until the broker's visibility timeout (an hour), and the runs wait for the
outbox sweep's backoff. Each node keeps the messages it holds in a Redis hash of task
id -> run id (added when a message is received, removed when that message's task
returns: keyed by message, because a deferral's next message for the same run can be
received before the task that sent it has returned); a node that starts
again under the same name (a supervisor's restart) re-sends what its last life
held. A re-sent start is harmless: the claim ignores a run that is not queued.
A node that never returns leaves its runs to the outbox sweep, as before.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import redis
from celery.signals import task_postrun, task_received, worker_init

from tasks.broker.publish import publisher
from tasks.constants import KEY_HELD_STARTS, QUEUE, TASK_START_ATTEMPT
from tasks.maintenance.restart import end_previous_leases
from tasks.sandbox.runtime import NODE_ENV
from tasks.store.notify import redis_client

log = logging.getLogger("playrun.held")

# A held set no live worker touches for this long is dropped (the sweep has those runs).
HELD_TTL_S = 24 * 3600


def _run_id(args: Any) -> str | None:
    if isinstance(args, (list, tuple)) and args and isinstance(args[0], str):
        return args[0]
    return None


def note_held(client: redis.Redis, node: str, task_id: str, run_id: str) -> None:
    with client.pipeline(transaction=False) as pipe:
        pipe.hset(KEY_HELD_STARTS + node, task_id, run_id)
        pipe.expire(KEY_HELD_STARTS + node, HELD_TTL_S)
        pipe.execute()


def note_done(client: redis.Redis, node: str, task_id: str) -> None:
    client.hdel(KEY_HELD_STARTS + node, task_id)


def held_runs(client: redis.Redis, node: str) -> set[str]:
    values: list[Any] = client.hvals(KEY_HELD_STARTS + node)  # type: ignore[assignment]
    return {_text(v) for v in values}


def take_held(client: redis.Redis, node: str) -> list[str]:
    """The runs this node's previous life held messages for, removed atomically."""
    with client.pipeline(transaction=True) as pipe:
        pipe.hvals(KEY_HELD_STARTS + node)
        pipe.delete(KEY_HELD_STARTS + node)
        values, _ = pipe.execute()
    return sorted({_text(v) for v in values})


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def connect() -> None:
    """Hook the worker's signals (called once, where the tasks are defined)."""

    def _received(sender: Any = None, request: Any = None, **_: Any) -> None:
        if request is None or getattr(request, "name", None) != TASK_START_ATTEMPT:
            return
        run_id = _run_id(getattr(request, "args", None))
        task_id = getattr(request, "id", None)
        node = getattr(sender, "hostname", None)
        if run_id is not None and task_id and node:
            try:
                note_held(redis_client(), node, str(task_id), run_id)
            except redis.RedisError as exc:  # only recovery speed is at stake
                log.warning("cannot note held start %s: %s", run_id, exc)

    def _done(sender: Any = None, task_id: Any = None, state: Any = None, **_: Any) -> None:
        # A retry re-sends this message (same task id, with a countdown) to be held again.
        if getattr(sender, "name", None) != TASK_START_ATTEMPT or state == "RETRY":
            return
        node = getattr(getattr(sender, "request", None), "hostname", None)
        if task_id and node:
            try:
                note_done(redis_client(), node, str(task_id))
            except redis.RedisError as exc:
                log.warning("cannot clear held start %s: %s", task_id, exc)

    def _resend(sender: Any = None, **_: Any) -> None:
        node = getattr(sender, "hostname", None)
        if not node:
            return
        os.environ[NODE_ENV] = node  # before the pool forks: its children claim as this node
        try:
            ended = end_previous_leases(node)
        except Exception as exc:  # noqa: BLE001 - the leases then expire on their own
            log.warning("cannot end the leases this worker held when it last stopped: %s", exc)
        else:
            if ended:
                log.warning("ended the leases of %d attempt(s) this worker claimed but never "
                            "launched, or launched but never started, when it last stopped; "
                            "the reaper retries them", len(ended))
        try:
            held = take_held(redis_client(), node)
            for run_id in held:
                publisher().send(TASK_START_ATTEMPT, [run_id], queue=QUEUE)
        except Exception as exc:  # noqa: BLE001 - the outbox sweep re-sends them anyway
            log.warning("cannot re-send the starts held before a restart: %s", exc)
            return
        if held:
            log.warning("re-sent %d start(s) this worker held when it last stopped", len(held))

    task_received.connect(_received, weak=False)
    task_postrun.connect(_done, weak=False)
    worker_init.connect(_resend, weak=False)
