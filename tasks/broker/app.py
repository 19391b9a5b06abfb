"""The Celery app (`celery -A tasks worker`), built by a factory and configured lazily.

Nothing here reads the environment or opens a connection: Celery loads `celeryconfig`
(and through it the settings) on first use of `app.conf`, so settings set after
`import tasks` take effect. A worker or beat imports the task modules, its start-up
checks and its metrics signals through `include`, before it reads its steps.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue  # type: ignore[attr-defined]

from tasks.broker import taskrepr  # noqa: F401  (its publish hook redacts what Flower shows)
from tasks.broker.config import make_queue
from tasks.broker.message import provider_queue as provider_queue  # re-exported
from tasks.broker.message import start_queue as start_queue  # re-exported

# Imported by workers and beat only; app code that just submits never loads them.
WORKER_MODULES = ("tasks.worker.boot", "tasks.worker.jobs", "tasks.worker.signals")


def create_app(config: str | object = "celeryconfig") -> Celery:
    """A playrun Celery app; `config` is read on first use, not here."""
    celery_app = Celery("playrun", include=list(WORKER_MODULES))
    celery_app.config_from_object(config)
    return celery_app


def queue(name: str) -> Queue:
    """A queue by name (the default one, or a host's own queue), as the app's broker
    declares it (a quorum queue on RabbitMQ)."""
    return make_queue(name, str(app.conf.broker_url or ""))


app = create_app()
