"""What the gateway counts: each request by action and answer code, and what each
committed action did (steps reused or executed, sheet rows written or rejected).

Effects are read from an action's reply, after its transaction committed: the reply is
the gateway's contract with the runner, so it says exactly what became durable.
"""

from __future__ import annotations

from typing import Any

from tasks.observe import metrics
from tasks.sheets.store import ALREADY_TERMINAL, NEWER, OLDER, UNREPORTED

UNKNOWN = "unknown"  # the body was refused before an action could be named
BATCH = "batch"
OK = "ok"
_REASONS = frozenset({NEWER, OLDER, ALREADY_TERMINAL, UNREPORTED})


def request_label(planned_names: list[str], batch: bool) -> str:
    """Only names of the action table (already resolved by `plan`) become labels."""
    if batch:
        return BATCH
    return planned_names[0] if planned_names else UNKNOWN


def request(action: str, code: str, seconds: float) -> None:
    metrics.gateway_request(action, code, seconds)


def effects(action: str, reply: Any) -> None:
    """Count what one committed action changed."""
    if not isinstance(reply, dict):
        return
    if action == "step_claim" and reply.get("state") == "reuse":
        metrics.receipt("reused")
    elif action == "step_complete" and reply.get("duplicate") is False:
        metrics.receipt("executed")
    elif action == "step_fail" and reply.get("duplicate") is False:
        metrics.receipt("failed")
    elif action == "sheet_write":
        metrics.sheet_rows(int(reply.get("written") or 0),
                           [_reason(r) for r in reply.get("rejected") or ()])
    elif action in ("sheet_start", "sheet_start_with_intent"):
        metrics.sheet_rows(0, [_reason(r) for r in reply.get("superseded") or ()])


def _reason(row: Any) -> str:
    reason = row.get("reason") if isinstance(row, dict) else None
    return reason if reason in _REASONS else "other"
