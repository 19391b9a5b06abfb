"""The terminal write: first fenced write wins; the outcome never changes after."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import Attempt, Run, db_now
from tasks.constants import (
    OUTPUT_INVALID,
    RUNTIME_RUNNER_LOST,
    TERMINAL_EVENT,
    TERMINAL_STATUSES,
    AttemptState,
    EventKind,
    RunStatus,
)
from tasks.errors import FenceLostError
from tasks.observe import metrics
from tasks.settings import get_settings
from tasks.settlement import pushed
from tasks.settlement.outcome import CANCELLED_OUTCOME, Outcome
from tasks.store import ledger
from tasks.store.db import after_commit, one_statement_first, session_scope
from tasks.store.fence import Fence, LaunchFence, hold, hold_launch, lock_run
from tasks.store.notify import run_settled


@dataclass(frozen=True)
class Settled:
    won: bool
    outcome: Outcome
    # Who holds what the attempt left (for the release that follows), when known.
    holder_token: str | None = None
    host_queue: str | None = None
    sandbox: tuple[str, str, str] | None = None  # its one sandbox, when the write read it


def _current(run: Run) -> Outcome:
    return Outcome(RunStatus(run.status), run.code, run.error, run.output)


def write_terminal(session: Session, run: Run, outcome: Outcome, generation: int | None) -> None:
    """Write the terminal fields and event; the caller holds the run lock (and the fence)."""
    run.status = outcome.status
    run.code = outcome.code
    run.error = outcome.error
    run.output = outcome.output
    run.finished_at = db_now()
    run.updated_at = db_now()
    run.deferred_until = None
    ledger.append(session, run.id, TERMINAL_EVENT[outcome.status],
                  {"code": outcome.code, "error": outcome.error}, generation)
    created_at = run.created_at
    # Counted by the writer that won, once its transaction is durable.
    after_commit(session, lambda: metrics.run_ended(
        outcome.status, outcome.code, created_at, outcome.code == RUNTIME_RUNNER_LOST))


# The database refused the values themselves: retrying the same write cannot help.
_REFUSED = (sa.exc.DataError, sa.exc.IntegrityError, sa.exc.ProgrammingError,
            sa.exc.StatementError)
_TRANSIENT = (sa.exc.OperationalError, sa.exc.InterfaceError)
CANCEL_REASON = "cancelled"
PUSHED_REASON = "pushed"


def unstorable(outcome: Outcome, exc: Exception) -> Outcome:
    """What to settle instead of an outcome the database would not store."""
    reason = str(getattr(exc, "orig", None) or exc).splitlines()[0][:300]
    return Outcome.failed(OUTPUT_INVALID,
                          f"the play's {outcome.status} result could not be stored: {reason}")


def _storing(write: Callable[[Outcome], Settled], outcome: Outcome) -> Settled:
    """An outcome the database refuses is settled as OUTPUT_INVALID instead, so a hostile
    document can never leave a run unsettleable."""
    try:
        return write(outcome)
    except _REFUSED as exc:
        if isinstance(exc, _TRANSIENT) or (outcome.output is None
                                            and outcome.status != RunStatus.SUCCEEDED):
            raise
        return write(unstorable(outcome, exc))


def _end(session: Session, run: Run, attempt: Attempt, outcome: Outcome, reason: str) -> Settled:
    attempt.state = AttemptState.ENDED
    attempt.end_reason = reason
    attempt.ended_at = db_now()
    if attempt.progress_dropped:
        ledger.append(session, run.id, EventKind.PROGRESS_DROPPED,
                      {"dropped": attempt.progress_dropped, "kept": attempt.progress_count},
                      attempt.generation)
    write_terminal(session, run, outcome, attempt.generation)
    return Settled(True, outcome, attempt.lease_token, attempt.host_queue)


def settle(fence: Fence, outcome: Outcome, *, reason: str) -> Settled:
    """Settle the run for this attempt holder. Raises FenceLostError if the attempt is not
    current and the run is not terminal; if a terminal already won, reports it (won=False)."""

    def write(chosen: Outcome) -> Settled:
        with session_scope() as session:
            try:
                run, attempt = hold(session, fence, allow_terminal=True)  # one round trip
            except FenceLostError:
                ended = lock_run(session, fence.run_id)
                if ended is not None and ended.status in TERMINAL_STATUSES:
                    return Settled(False, _current(ended))
                raise
            if run.status in TERMINAL_STATUSES:
                return Settled(False, _current(run))
            if run.cancel_requested_at is not None:
                # A cancel recorded before any terminal won decides the outcome (docs/design.md).
                return _end(session, run, attempt, CANCELLED_OUTCOME, CANCEL_REASON)
            return _end(session, run, attempt, chosen, reason)

    settled = _storing(write, outcome)
    if settled.won:
        run_settled(fence.run_id, settled.outcome.status)
    return settled


def settle_launch(fence: LaunchFence, outcome: Outcome, *,
                  reason: str = PUSHED_REASON) -> Settled:
    """A terminal pushed by the runner, or decided by the gateway for it (`reason`). With a
    cancel requested nothing is written here: the cancel deletes the sandbox first and
    then writes `cancelled` (docs/design.md)."""

    def write(chosen: Outcome) -> Settled:
        def fast(cur: psycopg.Cursor[Any]) -> Settled | None:
            done = pushed.settle(cur, fence, chosen, reason)
            if done is None:
                return None
            metrics.run_ended(chosen.status, chosen.code, done.created_at,
                              chosen.code == RUNTIME_RUNNER_LOST)
            return Settled(True, chosen, done.holder_token, done.host_queue, done.sandbox)

        def general() -> Settled:
            with session_scope() as session:
                run = lock_run(session, fence.run_id)
                if run is not None and run.status in TERMINAL_STATUSES:
                    return Settled(False, _current(run))
                run, attempt = hold_launch(session, fence, run)
                if run.cancel_requested_at is not None:
                    return Settled(False, CANCELLED_OUTCOME)
                return _end(session, run, attempt, chosen, reason)

        return one_statement_first(fast, general, postgres=get_settings().is_postgres)

    settled = _storing(write, outcome)
    if settled.won:
        run_settled(fence.run_id, settled.outcome.status)
    return settled


def settle_unattended(run_id: str, outcome: Outcome) -> Settled:
    """Settle a run that has no active attempt (cancelled while queued or deferred)."""
    with session_scope() as session:
        run = lock_run(session, run_id)
        if run is None:
            raise LookupError(run_id)
        if run.status in TERMINAL_STATUSES:
            return Settled(False, _current(run))
        active = session.scalar(sa.select(sa.func.count()).where(
            Attempt.run_id == run_id, Attempt.state == AttemptState.ACTIVE))
        if active:
            return Settled(False, _current(run))
        session.execute(sa.update(Attempt).where(
            Attempt.run_id == run_id, Attempt.state != AttemptState.ENDED
        ).values(state=AttemptState.ENDED, end_reason=outcome.code or outcome.status,
                 ended_at=db_now()))
        write_terminal(session, run, outcome, None)
    run_settled(run_id, outcome.status)
    return Settled(True, outcome)


def settle_forced(run_id: str, outcome: Outcome, reason: str) -> Settled:
    """Settle a run whatever its attempts hold: the last word when maintenance keeps
    failing on it. Its attempts end; the reaper's release retry then frees their rows."""
    with session_scope() as session:
        run = lock_run(session, run_id)
        if run is None:
            raise LookupError(run_id)
        if run.status in TERMINAL_STATUSES:
            return Settled(False, _current(run))
        session.execute(sa.update(Attempt).where(
            Attempt.run_id == run_id, Attempt.state != AttemptState.ENDED,
        ).values(state=AttemptState.ENDED, end_reason=reason, ended_at=db_now()))
        write_terminal(session, run, outcome, run.current_generation or None)
    run_settled(run_id, outcome.status)
    return Settled(True, outcome)
