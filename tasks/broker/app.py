"""The Celery app (`celery -A tasks worker`), built by a factory and configured lazily.

Nothing here reads the environment or opens a connection: Celery loads `celeryconfig`
(and through it the settings) on first use of `app.conf`, so settings set after
`import tasks` take effect. A worker or beat imports the task modules, its start-up
checks and its metrics signals through `include`, before it reads its steps.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Exchange, Queue  # type: ignore[attr-defined]

from tasks.broker import taskrepr  # noqa: F401  (its publish hook redacts what Flower shows)
from tasks.constants import PROVIDER_QUEUE_PREFIX, QUEUE

# Imported by workers and beat only; app code that just submits never loads them.
WORKER_MODULES = ("tasks.worker.boot", "tasks.worker.jobs", "tasks.worker.signals")


def create_app(config: str | object = "celeryconfig") -> Celery:
    """A playrun Celery app; `config` is read on first use, not here."""
    celery_app = Celery("playrun", include=list(WORKER_MODULES))
    celery_app.config_from_object(config)
    return celery_app


def queue(name: str) -> Queue:
    """A direct queue by name (the default one, or a host's own queue)."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name)  # type: ignore[no-untyped-call]


def provider_queue(provider: str) -> str:
    """The queue of starts placed on `provider`."""
    return f"{PROVIDER_QUEUE_PREFIX}{provider}"


def start_queue(args: list[Any]) -> str:
    """Where a start goes: its provider's queue when placed ([run_id, provider]), else
    the queue every worker takes."""
    if len(args) > 1 and isinstance(args[1], str) and args[1]:
        return provider_queue(args[1])
    return QUEUE


def send(name: str, args: list[Any], queue_name: str = QUEUE) -> None:
    app.send_task(name, args=args, queue=queue(queue_name), ignore_result=True)


app = create_app()
