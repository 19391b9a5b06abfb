"""playrun: run customer plays in isolated sandboxes, fenced and rate-limited fleet-wide.

`celery -A tasks worker` finds the Celery app here; app code uses submit_run(s),
get_run, cancel_run and run_events, and reads runtime sheets with sheet_rows.
"""

from tasks import (
    celery_metrics,  # noqa: F401  (metrics endpoints of workers and beat)
    jobs,  # noqa: F401  (registers the Celery tasks)
)
from tasks.api import (
    AttemptView,
    RunHandle,
    RunResult,
    RunView,
    cancel_run,
    get_run,
    list_runs,
    resolve_run_id,
    run_again,
    run_cursor,
    run_events,
    submit_run,
    submit_runs,
)
from tasks.app import app
from tasks.errors import PlayrunError
from tasks.ledger import Event
from tasks.sheets.view import SheetRowView, sheet_rows
from tasks.workreceipts import ReceiptView, clear_receipts, receipts

celery = app

__all__ = [
    "AttemptView",
    "Event",
    "PlayrunError",
    "ReceiptView",
    "RunHandle",
    "RunResult",
    "RunView",
    "SheetRowView",
    "app",
    "cancel_run",
    "clear_receipts",
    "get_run",
    "list_runs",
    "receipts",
    "resolve_run_id",
    "run_again",
    "run_cursor",
    "run_events",
    "sheet_rows",
    "submit_run",
    "submit_runs",
]
