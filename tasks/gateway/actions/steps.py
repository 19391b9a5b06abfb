"""`step_claim`, `step_complete`, `step_fail`: the gateway's side of `ctx.step`.

Requests are parsed and bounded here; the receipts themselves are claimed, completed and
failed by tasks/workreceipts/store.py, fenced on the runner's launch.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tasks.constants import MAX_STEP_KEY_CHARS, MAX_STEP_TTL_S
from tasks.gateway.actions.base import ActionRequest, Context, launch_of
from tasks.security.tokens import Grant
from tasks.workreceipts import store

MAX_STEP_ERROR_CHARS = 8192

StepKey = Field(min_length=1, max_length=MAX_STEP_KEY_CHARS, pattern=r"\S")
ClaimId = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")


class StepClaim(ActionRequest):
    action: Literal["step_claim"]
    key: str = StepKey
    claim_id: str = ClaimId


class StepComplete(ActionRequest):
    action: Literal["step_complete"]
    key: str = StepKey
    claim_id: str = ClaimId
    output: Any
    ttl_s: float | None = Field(default=None, gt=0, le=MAX_STEP_TTL_S)


class StepFail(ActionRequest):
    action: Literal["step_fail"]
    key: str = StepKey
    claim_id: str = ClaimId
    code: str = Field(min_length=1, max_length=64, pattern=r"^[A-Z][A-Z0-9_]*$")
    error: str = Field(default="", max_length=MAX_STEP_ERROR_CHARS)


def claim(grant: Grant, request: StepClaim, ctx: Context) -> dict[str, Any]:
    return store.claim(launch_of(grant), request.key, request.claim_id,
                       ctx.settings.heartbeat_timeout_s, ctx.settings.step_max_events)


def complete(grant: Grant, request: StepComplete, ctx: Context) -> dict[str, Any]:
    return store.complete(launch_of(grant), request.key, request.claim_id, request.output,
                          request.ttl_s, ctx.settings.step_max_events)


def fail(grant: Grant, request: StepFail, ctx: Context) -> dict[str, Any]:
    return store.fail(launch_of(grant), request.key, request.claim_id, request.code,
                      request.error, ctx.settings.step_max_events)
