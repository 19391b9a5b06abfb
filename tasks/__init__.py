"""playrun: run customer plays in isolated sandboxes, fenced and rate-limited fleet-wide.

`celery -A tasks worker` finds the Celery app here; app code uses submit_run(s) (items
of submit_runs are RunRequests or dicts), get_run, cancel_run and run_events, compares
statuses with RunStatus, and reads runtime sheets with sheet_rows.

Importing this package reads no setting and opens no connection: the public names load
their modules on first use, and the Celery app reads its configuration on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from tasks.broker.app import app

if TYPE_CHECKING:
    from tasks.admission.submit import RunRequest
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
    from tasks.constants import AttemptState, EventKind, ReceiptState, RunStatus, SheetRowStatus
    from tasks.errors import IdempotencyConflictError, PlayrunError
    from tasks.sheets.view import SheetRowView, sheet_rows
    from tasks.store.ledger import Event
    from tasks.workreceipts.view import ReceiptView, clear_receipts, receipts

celery = app

# Public name -> the module that defines it, imported on first access (PEP 562).
_LAZY = {
    **dict.fromkeys(
        ("AttemptView", "RunHandle", "RunResult", "RunView", "cancel_run", "get_run",
         "list_runs", "resolve_run_id", "run_again", "run_cursor", "run_events",
         "submit_run", "submit_runs"), "tasks.api"),
    **dict.fromkeys(
        ("AttemptState", "EventKind", "ReceiptState", "RunStatus", "SheetRowStatus"),
        "tasks.constants"),
    "RunRequest": "tasks.admission.submit",
    "PlayrunError": "tasks.errors",
    "IdempotencyConflictError": "tasks.errors",
    "Event": "tasks.store.ledger",
    "SheetRowView": "tasks.sheets.view",
    "sheet_rows": "tasks.sheets.view",
    "ReceiptView": "tasks.workreceipts.view",
    "clear_receipts": "tasks.workreceipts.view",
    "receipts": "tasks.workreceipts.view",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tasks' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "AttemptState",
    "AttemptView",
    "Event",
    "EventKind",
    "IdempotencyConflictError",
    "PlayrunError",
    "ReceiptState",
    "ReceiptView",
    "RunHandle",
    "RunRequest",
    "RunResult",
    "RunStatus",
    "RunView",
    "SheetRowStatus",
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
