"""The one table of gateway actions: each needs exactly one capability (SPEC 4.9)."""

from __future__ import annotations

from tasks.gateway.actions import complete, events, heartbeat, sheets, steps
from tasks.gateway.actions.base import Action, ActionRequest, Context
from tasks.security.tokens import (
    RUN_COMPLETE,
    RUN_HEARTBEAT,
    RUN_LEDGER_PROJECT,
    SHEET_READ,
    SHEET_WRITE,
    STEP_WRITE,
)

ACTIONS: dict[str, Action] = {
    a.name: a for a in (
        Action("heartbeat", RUN_HEARTBEAT, heartbeat.Heartbeat, heartbeat.handle),
        Action("append_run_events", RUN_LEDGER_PROJECT, events.AppendRunEvents, events.handle),
        Action("complete", RUN_COMPLETE, complete.Complete, complete.handle),
        Action("step_claim", STEP_WRITE, steps.StepClaim, steps.claim),
        Action("step_complete", STEP_WRITE, steps.StepComplete, steps.complete),
        Action("step_fail", STEP_WRITE, steps.StepFail, steps.fail),
        Action("sheet_start", SHEET_WRITE, sheets.SheetStart, sheets.start),
        Action("sheet_start_with_intent", SHEET_WRITE, sheets.SheetStartWithIntent,
               sheets.start_with_intent),
        Action("sheet_write", SHEET_WRITE, sheets.SheetWrite, sheets.write),
        Action("sheet_read", SHEET_READ, sheets.SheetRead, sheets.read),
    )
}

__all__ = ["ACTIONS", "Action", "ActionRequest", "Context"]
