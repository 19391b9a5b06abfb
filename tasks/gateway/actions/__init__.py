"""The one table of gateway actions: each needs exactly one capability (docs/contract.md)."""

from __future__ import annotations

from tasks import protocol
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
    a.name: a
    for a in (
        Action(protocol.ACTION_HEARTBEAT, RUN_HEARTBEAT, heartbeat.Heartbeat, heartbeat.handle),
        Action(
            protocol.ACTION_APPEND_EVENTS, RUN_LEDGER_PROJECT, events.AppendRunEvents, events.handle
        ),
        Action(protocol.ACTION_COMPLETE, RUN_COMPLETE, complete.Complete, complete.handle),
        Action(protocol.ACTION_STEP_CLAIM, STEP_WRITE, steps.StepClaim, steps.claim),
        Action(protocol.ACTION_STEP_COMPLETE, STEP_WRITE, steps.StepComplete, steps.complete),
        Action(protocol.ACTION_STEP_FAIL, STEP_WRITE, steps.StepFail, steps.fail),
        Action(protocol.ACTION_SHEET_START, SHEET_WRITE, sheets.SheetStart, sheets.start),
        Action(
            protocol.ACTION_SHEET_START_WITH_INTENT,
            SHEET_WRITE,
            sheets.SheetStartWithIntent,
            sheets.start_with_intent,
        ),
        Action(protocol.ACTION_SHEET_WRITE, SHEET_WRITE, sheets.SheetWrite, sheets.write),
        Action(protocol.ACTION_SHEET_READ, SHEET_READ, sheets.SheetRead, sheets.read),
    )
}

__all__ = ["ACTIONS", "Action", "ActionRequest", "Context"]
