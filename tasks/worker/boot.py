"""A worker's start-up: refuse a database behind the schema head, watch the consumer,
and consume this host's own sandbox queue.

Imported by the worker through the app's `include`, before it builds its steps.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.signals import celeryd_after_setup

from tasks.acquisition.placement import announce
from tasks.broker.app import app, provider_queue, queue
from tasks.errors import PlayrunError
from tasks.sandbox import providers
from tasks.sandbox.local import check_isolation
from tasks.sandbox.runtime import host_queue
from tasks.settings import get_settings
from tasks.store.db import require_current_schema
from tasks.worker.watchdog import BrokerWatchdog

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
            # The SDKs are imported in each pool process after fork, never here.
            providers.check_served(settings.served)
            if "local" in settings.served:
                check_isolation(settings)  # strict configured but unavailable: refuse
        except PlayrunError as exc:
            log.critical("refusing to start: %s", exc)
            raise SystemExit(f"playrun worker refused to start: {exc}") from exc


@celeryd_after_setup.connect
def _consume_host_queue(sender: Any, instance: Any, **_kwargs: Any) -> None:
    """Sandboxes only this host reaches are inspected and deleted through its own queue;
    starts placed on a provider arrive on that provider's queue."""
    served = get_settings().served
    for provider in served:
        name = host_queue(provider)
        if name is not None:
            instance.app.amqp.queues.select_add(queue(name))
            log.info("consuming this host's sandbox queue %s", name)
        instance.app.amqp.queues.select_add(queue(provider_queue(provider)))
    log.info("serving sandbox providers %s", ", ".join(served))
    try:
        announce(served)
    except Exception as exc:  # noqa: BLE001 - only `placement set` reads it
        log.warning("cannot announce the providers this worker serves: %s", exc)


if SchemaCheck not in app.steps["worker"]:
    app.steps["worker"].add(SchemaCheck)
    app.steps["consumer"].add(BrokerWatchdog)
