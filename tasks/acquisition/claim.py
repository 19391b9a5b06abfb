"""The claim: start_attempt opens generation n+1, or resumes a deferred one, or does nothing.

The run row is locked (FOR UPDATE SKIP LOCKED on PostgreSQL), so of any number of
duplicate deliveries exactly one opens the attempt; the rest see it and stop.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from models import Attempt, PlayBundle, Run, RunEvent, db_now, new_id
from tasks.constants import TERMINAL_STATUSES, AttemptState, EventKind, RunStatus
from tasks.store import ledger
from tasks.store.db import session_scope
from tasks.store.fence import Fence


class Skip(enum.StrEnum):
    """Why a claim opened nothing."""

    NOT_FOUND = "not_found"
    LOCKED = "locked"  # another worker holds the run row right now
    TERMINAL = "terminal"
    ACTIVE = "active"  # an attempt is live: a duplicate delivery
    NOT_DUE = "not_due"  # deferred until later by the database clock
    CANCEL = "cancel"


@dataclass(frozen=True)
class Claimed:
    fence: Fence
    org_id: str
    play_source: str
    input: Any
    resumed: bool


@dataclass(frozen=True)
class Skipped:
    reason: Skip


# Built once (as fence._HOLD): the run, whether it is due, and its play's source.
_LOCK = (
    sa.select(Run, sa.or_(Run.deferred_until.is_(None), Run.deferred_until <= db_now()),
              PlayBundle.source)
    .outerjoin(PlayBundle, PlayBundle.digest == Run.play_digest)
    .where(Run.id == sa.bindparam("run_id"))
    .execution_options(populate_existing=True)
)
_LOCK_PG = _LOCK.with_for_update(skip_locked=True, of=Run)


def _locked(session: Session, run_id: str) -> tuple[Run, Attempt | None, bool, str] | None:
    """The run row, locked (SKIP LOCKED), whether it is due by the database clock, its
    play's source, and then its current attempt; None if locked or missing."""
    postgres = session.get_bind().dialect.name == "postgresql"
    row = session.execute(_LOCK_PG if postgres else _LOCK, {"run_id": run_id}).first()
    if row is None:
        return None
    run = row[0]
    # Its own statement, after the lock: a join would hand back the attempt as of this
    # statement's snapshot while the locked run row is the newest version, so a claim
    # that lost a race by a hair would see the winner's generation without its attempt.
    current = None
    if run.current_generation:
        current = session.scalars(sa.select(Attempt).where(
            Attempt.run_id == run_id, Attempt.generation == run.current_generation,
        ).execution_options(populate_existing=True)).first()
    return run, current, bool(row[1]), row[2] or ""


def claim(session: Session, run_id: str, *, worker_id: str, lease_seconds: float
          ) -> Claimed | Skipped:
    found = _locked(session, run_id)
    if found is None:
        exists = session.scalar(sa.select(sa.func.count()).where(Run.id == run_id))
        return Skipped(Skip.LOCKED if exists else Skip.NOT_FOUND)
    run, current, due, source = found
    if run.status in TERMINAL_STATUSES:
        return Skipped(Skip.TERMINAL)
    if run.cancel_requested_at is not None:
        return Skipped(Skip.CANCEL)
    if not due:
        return Skipped(Skip.NOT_DUE)
    token = secrets.token_hex(16)
    if current is not None and current.state == AttemptState.ACTIVE:
        return Skipped(Skip.ACTIVE)
    resumed = current is not None and current.state == AttemptState.DEFERRED
    if resumed:
        assert current is not None
        current.lease_token = token
        current.state = AttemptState.ACTIVE
        current.worker_id = worker_id
        current.lease_expires_at = db_now(lease_seconds)
        # A new holder starts from scratch: nothing of an earlier cycle was launched.
        current.runner_started_at = None
        current.runner_deadline = None
        current.sandbox_id = None
        current.provider = None
        current.events_offset = 0
        generation = current.generation
    else:
        generation = run.current_generation + 1
        if session.get_bind().dialect.name == "postgresql":
            _open_in_one_statement(session, run, generation, token, worker_id, lease_seconds)
            return Claimed(Fence(run_id, generation, token), run.org_id, source, run.input,
                           False)
        session.add(Attempt(
            run_id=run_id, generation=generation, lease_token=token, worker_id=worker_id,
            state=AttemptState.ACTIVE, lease_expires_at=db_now(lease_seconds), events_offset=0,
        ))
        run.current_generation = generation
        ledger.append(session, run_id, EventKind.ATTEMPT_STARTED, {"generation": generation},
                      generation)
    run.status = RunStatus.RUNNING
    run.deferred_until = None
    run.updated_at = db_now()
    return Claimed(Fence(run_id, generation, token), run.org_id, source, run.input, resumed)


# Built once: building it costs more Python than the round trip it makes.
_NEW_ATTEMPT = sa.insert(Attempt).values(
    id=sa.bindparam("o_id"), run_id=sa.bindparam("o_run"),
    generation=sa.bindparam("o_gen"), lease_token=sa.bindparam("o_token"),
    worker_id=sa.bindparam("o_worker"), state=AttemptState.ACTIVE,
    lease_expires_at=db_now(sa.bindparam("o_lease", type_=sa.Float)),
    events_offset=0, progress_count=0, progress_dropped=0).cte("new_attempt")
_STARTED_EVENT = sa.insert(RunEvent).values(
    run_id=sa.bindparam("o_run"), generation=sa.bindparam("o_gen"), kind=EventKind.ATTEMPT_STARTED,
    data=sa.bindparam("o_data", type_=RunEvent.__table__.c.data.type)).cte("started_event")
_OPEN = (
    sa.update(Run).where(Run.id == sa.bindparam("o_run"))
    .values(current_generation=sa.bindparam("o_gen"), status=RunStatus.RUNNING, deferred_until=None,
            updated_at=db_now())
    .add_cte(_NEW_ATTEMPT).add_cte(_STARTED_EVENT)
)


def _open_in_one_statement(session: Session, run: Run, generation: int, token: str,
                           worker_id: str, lease_seconds: float) -> None:
    """The new attempt, its `attempt.started` event and the run's new state in one round
    trip (the run row is locked already); the ORM's flush would take three, and every
    start pays for them."""
    session.connection().execute(_OPEN, {
        "o_id": new_id(), "o_run": run.id, "o_gen": generation, "o_token": token,
        "o_worker": worker_id, "o_lease": float(lease_seconds),
        "o_data": {"generation": generation}})
    # The row changed under the ORM: keep its copy true without another UPDATE.
    for key, value in (("current_generation", generation), ("status", RunStatus.RUNNING),
                       ("deferred_until", None)):
        set_committed_value(run, key, value)


def seconds_until_due(run_id: str) -> float | None:
    """How long until a deferred run is due, by the database clock."""
    with session_scope(readonly=True) as session:
        row = session.execute(sa.select(Run.deferred_until, db_now()).where(
            Run.id == run_id)).first()
    if row is None or row[0] is None:
        return None
    return float((row[0] - row[1]).total_seconds())
