"""The work receipts behind `ctx.step`: claim, complete and fail, each fenced on the
runner's launch in the same transaction.

The receipt row decides who runs a step: the first claim inserts it (insert-if-absent),
later ones lock it. A claim answers `reuse` (a completed, unexpired receipt: its stored
output), `run` (this call now holds it and runs fn) or `wait` (another live attempt holds
it; poll again). A receipt whose holder ended, was fenced out or went silent is taken over
by the next claim. The org and play come from the run row, never from the runner.

The ledger rows they write are budgeted per attempt (`max_events`, all step kinds
together): a reused key writes one `step.reused` row per attempt and counts repeats on it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from models import Run, WorkReceipt, db_now
from tasks.constants import (
    MAX_STEP_OUTPUT_BYTES,
    RECEIPT_HELD,
    STEP_EVENTS,
    EventKind,
    ReceiptState,
)
from tasks.errors import ReceiptNotHeldError, StepOutputInvalidError
from tasks.parse.untrusted import encoded_size
from tasks.store import ledger
from tasks.store.db import is_postgres, session_scope
from tasks.store.fence import LaunchFence, hold_launch
from tasks.workreceipts.keys import owner_live, play_name, receipt_key

# How long a waiting runner is told to pause before it asks again (it backs off itself).
WAIT_HINT_S = 0.2


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


def _owner(fence: LaunchFence, claim_id: str) -> dict[str, Any]:
    return {"owner_run_id": fence.run_id, "owner_generation": fence.generation,
            "owner_launch_id": fence.launch_id, "claim_id": claim_id}


def _holds(receipt: WorkReceipt, fence: LaunchFence, claim_id: str) -> bool:
    return (receipt.owner_run_id, receipt.owner_generation, receipt.owner_launch_id,
            receipt.claim_id) == (fence.run_id, fence.generation, fence.launch_id, claim_id)


def _key_of(run: Run, step_key: str) -> str:
    return receipt_key(run.org_id, play_name(run.play_path), step_key)


def _append(session: Session, fence: LaunchFence, kind: EventKind, data: dict[str, Any],
            max_events: int) -> None:
    ledger.append_budgeted(session, fence.run_id, fence.generation, kind, data,
                           group="steps", kinds=STEP_EVENTS, budget=max_events)


def claim(fence: LaunchFence, step_key: str, claim_id: str, grace_s: float,
          max_events: int) -> dict[str, Any]:
    """`run` (this call holds the receipt now), `reuse` (its stored output) or `wait`."""
    with session_scope() as session:
        run, _attempt = hold_launch(session, fence)
        key = _key_of(run, step_key)
        found = _locked(session, key, grace_s)
        if found is None:
            if _insert_if_absent(session, {
                    "receipt_key": key, "org_id": run.org_id, "play": play_name(run.play_path),
                    "step_key": step_key, "status": ReceiptState.RUNNING,
                    **_owner(fence, claim_id)}):
                return {"state": "run"}
            found = _locked(session, key, grace_s)  # the concurrent claim that won
            assert found is not None
        receipt, fresh, live = found
        if receipt.status == ReceiptState.COMPLETED and fresh:
            if not ledger.bump_reused(session, fence.run_id, fence.generation, step_key):
                _append(session, fence, EventKind.STEP_REUSED,
                        {"key": step_key, "computed_by": receipt.owner_run_id, "count": 1},
                        max_events)
            return {"state": "reuse", "output": receipt.output,
                    "computed_by": receipt.owner_run_id}
        if receipt.status in RECEIPT_HELD:
            if _holds(receipt, fence, claim_id):
                return {"state": "run"}  # a retried claim: the answer was lost
            if live:
                return {"state": "wait", "retry_after_s": WAIT_HINT_S}
            _append(session, fence, EventKind.STEP_TAKEN_OVER,
                    {"key": step_key, "from_run": receipt.owner_run_id,
                     "from_generation": receipt.owner_generation}, max_events)
        # Free (failed, released, expired) or its holder is gone: this call takes it.
        for name, value in _owner(fence, claim_id).items():
            setattr(receipt, name, value)
        receipt.status = ReceiptState.RUNNING
        receipt.claim_count += 1
        receipt.output = receipt.code = receipt.error = None
        receipt.completed_at = receipt.expires_at = receipt.released_at = None
        receipt.claimed_at = receipt.updated_at = db_now()
    return {"state": "run"}


def _held_for_settling(session: Session, fence: LaunchFence, step_key: str, claim_id: str
                       ) -> tuple[WorkReceipt, str]:
    run, _attempt = hold_launch(session, fence)
    found = _locked(session, _key_of(run, step_key), None)
    if found is None or not _holds(found[0], fence, claim_id):
        raise ReceiptNotHeldError(f"this attempt does not hold the receipt of step "
                                  f"{step_key[:200]!r}")
    return found[0], found[0].status


def complete(fence: LaunchFence, step_key: str, claim_id: str, output: Any,
             ttl_s: float | None, max_events: int) -> dict[str, Any]:
    """Store the step's output; a retried complete with the same output is a duplicate."""
    size = encoded_size(output)
    if size > MAX_STEP_OUTPUT_BYTES:
        raise StepOutputInvalidError(
            f"the step output is {size} bytes; the limit is {MAX_STEP_OUTPUT_BYTES}")
    with session_scope() as session:
        receipt, status = _held_for_settling(session, fence, step_key, claim_id)
        if status == ReceiptState.COMPLETED and receipt.output == output:
            return {"state": ReceiptState.COMPLETED, "duplicate": True}  # a retried complete
        if status not in RECEIPT_HELD:
            raise ReceiptNotHeldError(f"the receipt of step {step_key[:200]!r} is "
                                      f"already {status}")
        receipt.status = ReceiptState.COMPLETED
        receipt.output = output
        receipt.completed_at = receipt.updated_at = db_now()
        receipt.expires_at = db_now(ttl_s) if ttl_s is not None else None
        _append(session, fence, EventKind.STEP_COMPLETED, {"key": step_key}, max_events)
    return {"state": ReceiptState.COMPLETED, "duplicate": False}


def fail(fence: LaunchFence, step_key: str, claim_id: str, code: str, error: str,
         max_events: int) -> dict[str, Any]:
    """Record the step's failure: its receipt is free for the next claim."""
    with session_scope() as session:
        receipt, status = _held_for_settling(session, fence, step_key, claim_id)
        if status == ReceiptState.FAILED:
            return {"state": ReceiptState.FAILED, "duplicate": True}
        if status not in RECEIPT_HELD:
            raise ReceiptNotHeldError(f"the receipt of step {step_key[:200]!r} is "
                                      f"already {status}")
        receipt.status = ReceiptState.FAILED
        receipt.code = code
        receipt.error = error
        receipt.updated_at = db_now()
        _append(session, fence, EventKind.STEP_FAILED,
                {"key": step_key, "code": code, "error": error[:1000]}, max_events)
    return {"state": ReceiptState.FAILED, "duplicate": False}
