"""`append_run_events`: progress from `ctx.log`, delivered in keyed batches.

Only the narrow projection token may call it, and only with an idempotency key and a
delivery lease owner; a repeated key writes nothing twice. Past the progress budget the
events are counted, not stored, and settlement records one event with the count.
"""

from __future__ import annotations

from typing import Any, Literal

import sqlalchemy as sa
from pydantic import Field

from models import EventDelivery
from tasks.constants import MAX_EVENT_BYTES, EventKind
from tasks.gateway.actions.base import ActionRequest, Context, launch_of
from tasks.security.tokens import Grant
from tasks.store import ledger
from tasks.store.db import session_scope
from tasks.store.fence import hold_launch

MAX_BATCH = 500


class ProgressItem(ActionRequest):
    seq: int = Field(ge=0, le=2**62)
    message: str = Field(max_length=MAX_EVENT_BYTES)
    fields: dict[str, Any] = {}
    t: float | None = None


class AppendRunEvents(ActionRequest):
    action: Literal["append_run_events"]
    idempotency_key: str = Field(min_length=1, max_length=200, pattern=r"\S")
    delivery_lease_owner: str = Field(min_length=1, max_length=200, pattern=r"\S")
    events: list[ProgressItem] = Field(max_length=MAX_BATCH)
    # Events the runner itself dropped (its buffer was full): counted toward the note.
    dropped: int = Field(default=0, ge=0, le=2**31 - 1)


def handle(grant: Grant, request: AppendRunEvents, ctx: Context) -> dict[str, Any]:
    fence = launch_of(grant)
    try:
        with session_scope() as session:
            _run, attempt = hold_launch(session, fence)
            known = session.get(EventDelivery, (grant.run_id, request.idempotency_key))
            if known is not None:
                return {"duplicate": True, "accepted": known.count, "dropped": 0}
            room = max(ctx.settings.progress_max_events - attempt.progress_count, 0)
            kept = request.events[:room]
            dropped = len(request.events) - len(kept) + request.dropped
            if room == 0:
                # Spent already: counted only, and no delivery row either (a repeat is
                # counted twice; no key can grow a table past the budget).
                attempt.progress_dropped = min(attempt.progress_dropped + dropped, 2**31 - 1)
                return {"duplicate": False, "accepted": 0, "dropped": dropped, "full": True}
            for item in kept:
                ledger.append(session, grant.run_id, EventKind.PROGRESS,
                              {"message": item.message, "fields": item.fields},
                              grant.generation)
            attempt.progress_count += len(kept)
            attempt.progress_dropped = min(attempt.progress_dropped + dropped, 2**31 - 1)
            session.add(EventDelivery(run_id=grant.run_id, owner=request.delivery_lease_owner,
                                      idempotency_key=request.idempotency_key,
                                      count=len(kept)))
    except sa.exc.IntegrityError:
        # A concurrent delivery with the same key committed first: this one is a repeat.
        return {"duplicate": True, "accepted": 0, "dropped": 0}
    # `full`: the budget is spent; the runner stops sending events and only counts them.
    return {"duplicate": False, "accepted": len(kept), "dropped": dropped,
            "full": len(kept) >= room}
