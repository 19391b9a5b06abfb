"""`step_claim`, `step_complete`, `step_fail`: the work receipts behind `ctx.step`.

Every write is fenced on the runner's launch in the same transaction, and the receipt row
decides who runs a step: the first claim inserts it (insert-if-absent), later ones lock it.
A claim answers `reuse` (a completed, unexpired receipt: its stored output), `run` (this
call now holds it and runs fn) or `wait` (another live attempt holds it; poll again). A
receipt whose holder ended, was fenced out or went silent is taken over by the next claim.
The org and play come from the run row, never from the runner.
"""

from __future__ import annotations

from typing import Any, Literal

import sqlalchemy as sa
from pydantic import Field
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from models import Run, WorkReceipt, db_now
from tasks.constants import (
    EV_STEP_COMPLETED,
    EV_STEP_FAILED,
    EV_STEP_REUSED,
    EV_STEP_TAKEN_OVER,
    MAX_STEP_KEY_CHARS,
    MAX_STEP_OUTPUT_BYTES,
    MAX_STEP_TTL_S,
    RECEIPT_COMPLETED,
    RECEIPT_FAILED,
    RECEIPT_HELD,
    RECEIPT_RUNNING,
)
from tasks.errors import ReceiptNotHeldError, StepOutputInvalidError
from tasks.gateway.actions.base import ActionRequest, Context, launch_of
from tasks.parse.untrusted import encoded_size
from tasks.receipts.view import owner_live, play_name, receipt_key
from tasks.security.tokens import Grant
from tasks.store import ledger
from tasks.store.db import is_postgres, session_scope
from tasks.store.fence import hold_launch

MAX_STEP_ERROR_CHARS = 8192
# How long a waiting runner is told to pause before it asks again (it backs off itself).
WAIT_HINT_S = 0.2

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


def _locked(session: Session, key: str, grace_s: float | None
            ) -> tuple[WorkReceipt, bool, bool] | None:
    """The receipt row, locked, with (reusable now, its owner still live) by the DB clock."""
    fresh = sa.or_(WorkReceipt.expires_at.is_(None), WorkReceipt.expires_at > db_now())
    stmt = sa.select(WorkReceipt, fresh, owner_live(grace_s)).where(
        WorkReceipt.receipt_key == key)
    if is_postgres(session):
        stmt = stmt.with_for_update(of=WorkReceipt)
    row = session.execute(stmt.execution_options(populate_existing=True)).first()
    return None if row is None else (row[0], bool(row[1]), bool(row[2]))


def _insert_if_absent(session: Session, values: dict[str, Any]) -> bool:
    """True if this transaction created the receipt; False if a concurrent claim did."""
    insert = postgresql.insert if is_postgres(session) else sqlite.insert
    # RETURNING, not rowcount: the driver reports -1 for an INSERT ... ON CONFLICT.
    return session.execute(insert(WorkReceipt).values(**values)
                           .on_conflict_do_nothing(index_elements=["receipt_key"])
                           .returning(WorkReceipt.receipt_key)).first() is not None


def _owner(grant: Grant, claim_id: str) -> dict[str, Any]:
    return {"owner_run_id": grant.run_id, "owner_generation": grant.generation,
            "owner_launch_id": grant.launch_id, "claim_id": claim_id}


def _holds(receipt: WorkReceipt, grant: Grant, claim_id: str) -> bool:
    return (receipt.owner_run_id, receipt.owner_generation, receipt.owner_launch_id,
            receipt.claim_id) == (grant.run_id, grant.generation, grant.launch_id, claim_id)


def _key_of(run: Run, step_key: str) -> str:
    return receipt_key(run.org_id, play_name(run.play_path), step_key)


def claim(grant: Grant, request: StepClaim, ctx: Context) -> dict[str, Any]:
    grace = ctx.settings.heartbeat_timeout_s
    with session_scope() as session:
        run, _attempt = hold_launch(session, launch_of(grant))
        key = _key_of(run, request.key)
        found = _locked(session, key, grace)
        if found is None:
            if _insert_if_absent(session, {
                    "receipt_key": key, "org_id": run.org_id, "play": play_name(run.play_path),
                    "step_key": request.key, "status": RECEIPT_RUNNING,
                    **_owner(grant, request.claim_id)}):
                return {"state": "run"}
            found = _locked(session, key, grace)  # the concurrent claim that won
            assert found is not None
        receipt, fresh, live = found
        if receipt.status == RECEIPT_COMPLETED and fresh:
            ledger.append(session, grant.run_id, EV_STEP_REUSED,
                          {"key": request.key, "computed_by": receipt.owner_run_id},
                          grant.generation)
            return {"state": "reuse", "output": receipt.output,
                    "computed_by": receipt.owner_run_id}
        if receipt.status in RECEIPT_HELD:
            if _holds(receipt, grant, request.claim_id):
                return {"state": "run"}  # a retried claim: the answer was lost
            if live:
                return {"state": "wait", "retry_after_s": WAIT_HINT_S}
            ledger.append(session, grant.run_id, EV_STEP_TAKEN_OVER,
                          {"key": request.key, "from_run": receipt.owner_run_id,
                           "from_generation": receipt.owner_generation}, grant.generation)
        # Free (failed, released, expired) or its holder is gone: this call takes it.
        for name, value in _owner(grant, request.claim_id).items():
            setattr(receipt, name, value)
        receipt.status = RECEIPT_RUNNING
        receipt.claim_count += 1
        receipt.output = receipt.code = receipt.error = None
        receipt.completed_at = receipt.expires_at = receipt.released_at = None
        receipt.claimed_at = receipt.updated_at = db_now()
    return {"state": "run"}


def _held_for_settling(session: Session, grant: Grant, step_key: str, claim_id: str
                       ) -> tuple[WorkReceipt, str]:
    run, _attempt = hold_launch(session, launch_of(grant))
    found = _locked(session, _key_of(run, step_key), None)
    if found is None or not _holds(found[0], grant, claim_id):
        raise ReceiptNotHeldError(f"this attempt does not hold the receipt of step "
                                  f"{step_key[:200]!r}")
    return found[0], found[0].status


def complete(grant: Grant, request: StepComplete, _ctx: Context) -> dict[str, Any]:
    size = encoded_size(request.output)
    if size > MAX_STEP_OUTPUT_BYTES:
        raise StepOutputInvalidError(
            f"the step output is {size} bytes; the limit is {MAX_STEP_OUTPUT_BYTES}")
    with session_scope() as session:
        receipt, status = _held_for_settling(session, grant, request.key, request.claim_id)
        if status == RECEIPT_COMPLETED and receipt.output == request.output:
            return {"state": "completed", "duplicate": True}  # a retried complete
        if status not in RECEIPT_HELD:
            raise ReceiptNotHeldError(f"the receipt of step {request.key[:200]!r} is "
                                      f"already {status}")
        receipt.status = RECEIPT_COMPLETED
        receipt.output = request.output
        receipt.completed_at = receipt.updated_at = db_now()
        receipt.expires_at = db_now(request.ttl_s) if request.ttl_s is not None else None
        ledger.append(session, grant.run_id, EV_STEP_COMPLETED, {"key": request.key},
                      grant.generation)
    return {"state": "completed", "duplicate": False}


def fail(grant: Grant, request: StepFail, _ctx: Context) -> dict[str, Any]:
    with session_scope() as session:
        receipt, status = _held_for_settling(session, grant, request.key, request.claim_id)
        if status == RECEIPT_FAILED:
            return {"state": "failed", "duplicate": True}
        if status not in RECEIPT_HELD:
            raise ReceiptNotHeldError(f"the receipt of step {request.key[:200]!r} is "
                                      f"already {status}")
        receipt.status = RECEIPT_FAILED
        receipt.code = request.code
        receipt.error = request.error
        receipt.updated_at = db_now()
        ledger.append(session, grant.run_id, EV_STEP_FAILED,
                      {"key": request.key, "code": request.code,
                       "error": request.error[:1000]}, grant.generation)
    return {"state": "failed", "duplicate": False}
