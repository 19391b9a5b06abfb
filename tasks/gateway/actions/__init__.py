"""The one table of gateway actions: each needs exactly one capability (docs/contract.md), and
has a body bound of its own (a beat needs bytes, a result document megabytes)."""

from __future__ import annotations

from tasks import protocol
from tasks.gateway.actions import complete, events, exited, heartbeat, sheets, standby, steps
from tasks.gateway.actions.base import KIB, Action, ActionRequest, Context
from tasks.security.tokens import (
    POOL_STANDBY,
    RUN_COMPLETE,
    RUN_EXIT,
    RUN_HEARTBEAT,
    RUN_LEDGER_PROJECT,
    SHEET_READ,
    SHEET_WRITE,
    STEP_WRITE,
)

ACTIONS: dict[str, Action] = {
    a.name: a for a in (
        Action(protocol.ACTION_HEARTBEAT, RUN_HEARTBEAT, heartbeat.Heartbeat, heartbeat.handle,
               4 * KIB),
        Action(protocol.ACTION_APPEND_EVENTS, RUN_LEDGER_PROJECT, events.AppendRunEvents,
               events.handle, 4096 * KIB),
        Action(protocol.ACTION_COMPLETE, RUN_COMPLETE, complete.Complete, complete.handle,
               4096 * KIB),
        Action(protocol.ACTION_STEP_CLAIM, STEP_WRITE, steps.StepClaim, steps.claim, 16 * KIB),
        Action(protocol.ACTION_STEP_COMPLETE, STEP_WRITE, steps.StepComplete, steps.complete,
               1024 * KIB),
        Action(protocol.ACTION_STEP_FAIL, STEP_WRITE, steps.StepFail, steps.fail, 64 * KIB),
        Action(protocol.ACTION_SHEET_START, SHEET_WRITE, sheets.SheetStart, sheets.start,
               4096 * KIB),
        Action(protocol.ACTION_SHEET_START_WITH_INTENT, SHEET_WRITE, sheets.SheetStartWithIntent,
               sheets.start_with_intent, 4096 * KIB),
        Action(protocol.ACTION_SHEET_WRITE, SHEET_WRITE, sheets.SheetWrite, sheets.write,
               4096 * KIB),
        Action(protocol.ACTION_SHEET_READ, SHEET_READ, sheets.SheetRead, sheets.read, 256 * KIB),
        Action(protocol.ACTION_EXITED, RUN_EXIT, exited.Exited, exited.handle, 4 * KIB),
        Action(protocol.ACTION_STANDBY, POOL_STANDBY, standby.Standby, standby.handle,
               4 * KIB),
    )
}

__all__ = ["ACTIONS", "Action", "ActionRequest", "Context"]
