"""The Celery app (`celery -A tasks worker`) and its start-up schema check."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, bootsteps

from tasks.db import require_current_schema
from tasks.errors import PlayrunError
from tasks.maintenance.watchdog import BrokerWatchdog
from tasks.sandbox.local import check_isolation
from tasks.settings import get_settings

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


app = Celery("playrun")
app.config_from_object("celeryconfig")
app.steps["worker"].add(SchemaCheck)
app.steps["consumer"].add(BrokerWatchdog)
