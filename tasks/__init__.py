"""playrun: run customer plays in isolated sandboxes, fenced and rate-limited fleet-wide.

`celery -A tasks worker` finds the Celery app here; app code uses submit_run,
get_run, cancel_run and run_events, and reads runtime sheets with sheet_rows.
"""

from tasks import jobs  # noqa: F401  (registers the Celery tasks)
from tasks.api import (
    AttemptView,
    RunHandle,
    RunResult,
    RunView,
    cancel_run,
    get_run,
    list_runs,
    run_events,
    submit_run,
)
from tasks.app import app
from tasks.errors import PlayrunError
from tasks.ledger import Event
from tasks.sheets.view import SheetRowView, sheet_rows

celery = app

__all__ = [
    "AttemptView",
    "Event",
    "PlayrunError",
    "RunHandle",
    "RunResult",
    "RunView",
    "SheetRowView",
    "app",
    "cancel_run",
    "get_run",
    "list_runs",
    "run_events",
    "sheet_rows",
    "submit_run",
]
