"""What the dashboard's run page shows, read in one read-only transaction.

Everything here came from a play, a sandbox or an operator (errors, ledger data,
outputs, keys): it is cut to a bounded size here and escaped by the templates.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import (
    Attempt,
    Run,
    RunEvent,
    RuntimeResource,
    Sheet,
    SheetRow,
    SheetWriteIntent,
    WorkReceipt,
    db_now,
)
from tasks.constants import (
    CANCELLED_CODE,
    DASHBOARD_EVENTS_PAGE,
    INPUT_INVALID,
    OUTPUT_INVALID,
    PLAY_ERROR,
    PLAY_INVALID,
    PLAY_NOT_FOUND,
    RUN_TIMEOUT,
    RUNTIME_INTERNAL_ERROR,
    RUNTIME_RUNNER_LOST,
    SANDBOX_CAPACITY_EXCEEDED,
    SANDBOX_START_FAILED,
    START_DEFERRAL_EXHAUSTED,
    STEP_CODES,
    AttemptState,
    EventKind,
)
from tasks.errors import RunNotFoundError
from tasks.parse.checks import check_run_id
from tasks.store.db import session_scope

MAX_TEXT = 2000  # characters of one value (an error, an event's data, an output)
MAX_TIMELINE = 100  # lifecycle events shown per attempt
MAX_ROWS = 50  # sandboxes, receipts and sheets listed per run


class FailureClass(enum.Enum):
    """Who a failure belongs to: what an operator answers a customer first."""

    PLAY = "play"  # the customer's code or data
    BEFORE_CODE = "before code"  # capacity, start-rate, provider: no customer code ran
    RUNTIME = "runtime"  # playrun lost the runner or failed itself
    SHEET = "sheet"  # superseded or refused sheet writes
    CANCELLED = "cancelled"
    OTHER = "other"


_CLASSES = {
    **dict.fromkeys((PLAY_ERROR, PLAY_INVALID, PLAY_NOT_FOUND, OUTPUT_INVALID, INPUT_INVALID,
                     RUN_TIMEOUT, *STEP_CODES), FailureClass.PLAY),
    **dict.fromkeys((SANDBOX_CAPACITY_EXCEEDED, START_DEFERRAL_EXHAUSTED, SANDBOX_START_FAILED),
                    FailureClass.BEFORE_CODE),
    **dict.fromkeys((RUNTIME_RUNNER_LOST, RUNTIME_INTERNAL_ERROR), FailureClass.RUNTIME),
    CANCELLED_CODE: FailureClass.CANCELLED,
}


def failure_class(code: str | None) -> FailureClass | None:
    if not code:
        return None
    if code.startswith("RUNTIME_SHEET_"):
        return FailureClass.SHEET
    return _CLASSES.get(code, FailureClass.OTHER)


def clip(value: Any, limit: int = MAX_TEXT) -> str:
    """Any stored value as bounded text (JSON for structures)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str,
                                                           ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


@dataclass(frozen=True)
class EventRow:
    id: int
    at: datetime
    kind: str
    generation: int | None
    data: str


@dataclass(frozen=True)
class AttemptPanel:
    generation: int
    state: str
    worker_id: str | None
    provider: str | None
    sandbox_id: str | None
    started_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    failure: FailureClass | None
    last_seen_at: datetime | None  # its last heartbeat (or its launch)
    last_seen_s: float | None  # how long ago, by the database clock
    heartbeat_deadline: datetime | None  # a launched, active runner counts as lost then
    healthy: bool | None  # a launched, active runner: its lease has not run out
    next_retry_at: datetime | None  # a deferred attempt resumes then
    deferral_cause: str | None
    timeline: list[EventRow]


@dataclass(frozen=True)
class SandboxRow:
    provider: str
    sandbox_id: str
    generation: int
    state: str
    created_at: datetime
    deleted_at: datetime | None
    last_error: str | None


@dataclass(frozen=True)
class StepSummary:
    reused: int = 0
    computed: int = 0
    failed: int = 0
    taken_over: int = 0
    receipts: list[tuple[str, str, str]] = field(default_factory=list)  # key, status, output


@dataclass(frozen=True)
class SheetPanel:
    table: str
    version: int
    kind: str
    rows_by_status: dict[str, int]
    # Rows of the sheet now owned by a newer write version: (version, its run, rows).
    # This run's writes to them were rejected as stale (`newer_write_version`).
    newer: list[tuple[int, str, int]]


@dataclass(frozen=True)
class EventPage:
    events: list[EventRow]
    after: int | None  # cursor of the next page (None: this is the last)
    total: int


@dataclass(frozen=True)
class RunPage:
    id: str
    org_id: str
    status: str
    code: str | None
    failure: FailureClass | None
    error: str | None
    output: str
    input: str
    play_path: str
    play_digest: str
    idempotency_key: str | None
    created_at: datetime
    finished_at: datetime | None
    deferral_count: int
    now: datetime
    attempts: list[AttemptPanel]
    ledger: EventPage
    sandboxes: list[SandboxRow]
    steps: StepSummary
    sheets: list[SheetPanel]


def _event(e: RunEvent) -> EventRow:
    return EventRow(e.id, e.at, e.kind, e.generation, clip(e.data or {}))


def event_page(session: Session, run_id: str, after: int | None, tail: bool,
               size: int = DASHBOARD_EVENTS_PAGE) -> EventPage:
    """One page of the ledger in order: from `after` on, or the newest page with `tail`."""
    base = sa.select(RunEvent).where(RunEvent.run_id == run_id)
    total = int(session.scalar(sa.select(sa.func.count()).select_from(RunEvent)
                               .where(RunEvent.run_id == run_id)) or 0)
    if tail:
        rows = list(reversed(list(session.scalars(
            base.order_by(RunEvent.id.desc()).limit(size)))))
        return EventPage([_event(e) for e in rows], None, total)
    if after is not None:
        base = base.where(RunEvent.id > after)
    rows = list(session.scalars(base.order_by(RunEvent.id).limit(size + 1)))
    more = len(rows) > size
    rows = rows[:size]
    return EventPage([_event(e) for e in rows], rows[-1].id if more else None, total)


def _attempt_failure(run: Run, a: Attempt) -> FailureClass | None:
    """The run's code belongs to its last attempt; an earlier one ended with its own reason
    (a code, or a word such as `pushed` or `deferred`)."""
    if a.generation == run.current_generation and a.state != AttemptState.ACTIVE and run.code:
        return failure_class(run.code)
    reason = a.end_reason or ""
    return failure_class(reason) if reason.isupper() else None


def _attempts(session: Session, run: Run, now: datetime) -> list[AttemptPanel]:
    attempts = list(session.scalars(sa.select(Attempt).where(Attempt.run_id == run.id)
                                    .order_by(Attempt.generation)))
    panels = []
    for a in attempts:
        timeline = [_event(e) for e in session.scalars(
            sa.select(RunEvent).where(RunEvent.run_id == run.id,
                                      RunEvent.generation == a.generation,
                                      RunEvent.kind != EventKind.PROGRESS)
            .order_by(RunEvent.id).limit(MAX_TIMELINE))]
        seen = a.last_heartbeat_at or a.runner_started_at
        launched_active = a.runner_started_at is not None and a.state == AttemptState.ACTIVE
        deferred = a.state == AttemptState.DEFERRED
        panels.append(AttemptPanel(
            a.generation, a.state, a.worker_id, a.provider, a.sandbox_id, a.started_at,
            a.ended_at, a.end_reason,
            _attempt_failure(run, a),
            seen, None if seen is None else max(0.0, (now - seen).total_seconds()),
            a.lease_expires_at if launched_active else None,
            (a.lease_expires_at > now) if launched_active else None,
            run.deferred_until if deferred else None,
            run.last_deferral_cause if deferred else None, timeline))
    return panels


def _steps(session: Session, run_id: str) -> StepSummary:
    counts = dict(session.execute(
        sa.select(RunEvent.kind, sa.func.count()).where(
            RunEvent.run_id == run_id,
            RunEvent.kind.in_([EventKind.STEP_REUSED, EventKind.STEP_COMPLETED,
                               EventKind.STEP_FAILED, EventKind.STEP_TAKEN_OVER]))
        .group_by(RunEvent.kind)).all())
    receipts = [(clip(r.step_key, 200), r.status, clip(r.output, 200) if r.output is not None
                 else (r.code or "")) for r in session.scalars(
        sa.select(WorkReceipt).where(WorkReceipt.owner_run_id == run_id)
        .order_by(WorkReceipt.step_key).limit(MAX_ROWS))]
    return StepSummary(int(counts.get(EventKind.STEP_REUSED, 0)),
                       int(counts.get(EventKind.STEP_COMPLETED, 0)),
                       int(counts.get(EventKind.STEP_FAILED, 0)),
                       int(counts.get(EventKind.STEP_TAKEN_OVER, 0)), receipts)


def _sheets(session: Session, run_id: str) -> list[SheetPanel]:
    panels = []
    intents = session.execute(
        sa.select(SheetWriteIntent, Sheet.name).join(Sheet, Sheet.id == SheetWriteIntent.sheet_id)
        .where(SheetWriteIntent.run_id == run_id)
        .order_by(Sheet.name, SheetWriteIntent.version).limit(MAX_ROWS)).all()
    for intent, name in intents:
        mine: dict[str, int] = {}
        newer: dict[int, int] = {}
        for version, status, count in session.execute(
                sa.select(SheetRow.write_version, SheetRow.status, sa.func.count())
                .where(SheetRow.sheet_id == intent.sheet_id,
                       SheetRow.write_version >= intent.version)
                .group_by(SheetRow.write_version, SheetRow.status)):
            if version == intent.version:
                mine[status] = int(count)
            else:
                newer[version] = newer.get(version, 0) + int(count)
        owners = dict(session.execute(
            sa.select(SheetWriteIntent.version, SheetWriteIntent.run_id).where(
                SheetWriteIntent.sheet_id == intent.sheet_id,
                SheetWriteIntent.version.in_(list(newer)))).all()) if newer else {}
        panels.append(SheetPanel(name, intent.version, intent.kind, mine,
                                 [(v, str(owners.get(v, "?")), n)
                                  for v, n in sorted(newer.items())]))
    return panels


def run_page(run_id: str, *, after: int | None = None, tail: bool = False) -> RunPage:
    run_id = check_run_id(run_id)
    with session_scope(readonly=True) as session:
        run = session.get(Run, run_id)
        if run is None:
            raise RunNotFoundError(f"no run with id {run_id}")
        now = session.scalar(sa.select(db_now()))
        assert now is not None
        sandboxes = [SandboxRow(r.provider, r.sandbox_id, r.generation, r.state, r.created_at,
                                r.deleted_at, clip(r.last_error) if r.last_error else None)
                     for r in session.scalars(
                         sa.select(RuntimeResource).where(RuntimeResource.run_id == run_id)
                         .order_by(RuntimeResource.created_at).limit(MAX_ROWS))]
        return RunPage(
            run.id, run.org_id, run.status, run.code, failure_class(run.code),
            clip(run.error) if run.error else None,
            clip(run.output) if run.output is not None else "", clip(run.input),
            run.play_path, run.play_digest, run.idempotency_key, run.created_at,
            run.finished_at, run.deferral_count, now, _attempts(session, run, now),
            event_page(session, run_id, after, tail), sandboxes, _steps(session, run_id),
            _sheets(session, run_id))
