"""The Celery app (`celery -A tasks worker`) and its start-up schema check."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, bootsteps
from celery.signals import celeryd_after_setup
from kombu import Exchange, Queue  # type: ignore[attr-defined]

from tasks import taskrepr  # noqa: F401  (its publish hook redacts what Flower shows)
from tasks.constants import QUEUE
from tasks.db import require_current_schema
from tasks.errors import PlayrunError
from tasks.runtime import host_queue
from tasks.sandbox.local import check_isolation
from tasks.settings import get_settings
from tasks.watchdog import BrokerWatchdog

log = logging.getLogger("playrun.worker")


class SchemaCheck(bootsteps.Step):
    """Refuse to start a worker on a database that is not at the Alembic head.

    A bootstep, not a signal handler: an exception here stops the worker instead
    of being logged and ignored.
    """

    name = "playrun schema check"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        try:
            settings = get_settings().check_for_server()
            require_current_schema()
            if settings.sandbox_provider == "local":
                check_isolation(settings)  # strict configured but unavailable: refuse
        except PlayrunError as exc:
            log.critical("refusing to start: %s", exc)
            raise SystemExit(f"playrun worker refused to start: {exc}") from exc


def queue(name: str) -> Queue:
    """A direct queue by name (the default one, or a host's own queue)."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name)  # type: ignore[no-untyped-call]


def send(name: str, args: list[Any], queue_name: str = QUEUE) -> None:
    app.send_task(name, args=args, queue=queue(queue_name), ignore_result=True)


@celeryd_after_setup.connect
def _consume_host_queue(sender: Any, instance: Any, **_kwargs: Any) -> None:
    """Sandboxes only this host reaches are inspected and deleted through its own queue."""
    name = host_queue()
    if name is not None:
        instance.app.amqp.queues.select_add(queue(name))
        log.info("consuming this host's sandbox queue %s", name)


app = Celery("playrun")
app.config_from_object("celeryconfig")
app.steps["worker"].add(SchemaCheck)
app.steps["consumer"].add(BrokerWatchdog)
