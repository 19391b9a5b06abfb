"""The public API for app code: submit_run(s), get_run, cancel_run, run_events, list_runs.

Every argument is checked by tasks.admission.validate before it reaches SQL.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa

from models import Attempt, Run, db_now
from tasks.acquisition.fairshare import relay as fair_relay
from tasks.admission.again import admit_again
from tasks.admission.relay import Message, publish_admitted, publish_due
from tasks.admission.rows import start_args
from tasks.admission.submit import Admitted, RunRequest, admit, admit_many
from tasks.broker.publish import send
from tasks.constants import (
    DEFAULT_EVENTS_PAGE,
    KEY_RUN_DONE,
    MAX_EVENTS_PAGE,
    MAX_SQL_BIGINT,
    QUEUE,
    TASK_CANCEL_ATTEMPT,
    TASK_START_ATTEMPT,
    TERMINAL_STATUSES,
    AttemptState,
    EventKind,
    RunStatus,
    StartOrder,
)
from tasks.errors import RunNotFoundError, RunWaitTimeoutError
from tasks.parse.checks import check_count, check_run_id, check_wait_timeout
from tasks.settings import get_settings
from tasks.settlement.outcome import CANCELLED_OUTCOME
from tasks.settlement.terminal import settle_unattended
from tasks.store import ledger
from tasks.store.db import ensure_schema_once, get_engine, session_scope
from tasks.store.fence import lock_run
from tasks.store.notify import redis_client
from tasks.store.runquery import RunFilter, find_runs
from tasks.store.runquery import resolve_run_id as resolve_run_id  # re-exported for app code
from tasks.store.runquery import run_cursor as run_cursor


@dataclass(frozen=True)
class RunResult:
    """A run's terminal outcome, as `RunHandle.wait` returns it: `output` on success,
    `code` and `error` on failure."""

    status: RunStatus
    output: Any
    error: str | None
    code: str | None


@dataclass(frozen=True)
class AttemptView:
    """One attempt of a run: its generation and state, its sandbox, when it started and
    ended, and (while running) its last heartbeat and heartbeat deadline."""

    generation: int
    state: AttemptState
    sandbox_id: str | None
    started_at: datetime
    ended_at: datetime | None
    # For a launched runner: its last recorded heartbeat, and when it counts as lost.
    last_heartbeat_at: datetime | None = None
    heartbeat_deadline: datetime | None = None


@dataclass(frozen=True)
class RunView:
    """A run as `get_run` reads it: status, outcome, timestamps and its attempts (empty in
    `list_runs`, which reads runs without them)."""

    id: str
    org_id: str
    status: RunStatus  # a StrEnum: equal to its plain string too
    code: str | None
    error: str | None
    output: Any
    created_at: datetime
    finished_at: datetime | None
    attempts: list[AttemptView]
    play_path: str
    idempotency_key: str | None
    deferral_count: int

    @property
    def sandbox_id(self) -> str | None:
        return self.attempts[-1].sandbox_id if self.attempts else None

    def result(self) -> RunResult:
        return RunResult(self.status, self.output, self.error, self.code)


class RunHandle:
    """A submitted run. `created` is False when an idempotency key matched an earlier run."""

    def __init__(self, run_id: str, created: bool = True, published: bool = True) -> None:
        self.id = run_id
        self.created = created
        # False when the broker (or, in fair order, its relay) did not answer: the run is
        # committed, the sweep sends it.
        self.published = published

    def __repr__(self) -> str:
        return f"RunHandle({self.id!r})"

    def view(self) -> RunView:
        """The run as it is now (`get_run`)."""
        return get_run(self.id)

    def wait(self, timeout: float | None = 60.0) -> RunResult:
        """Wait for the terminal outcome: a Redis notification, with SQL polls as the backstop.

        `timeout` is None (wait for ever) or finite seconds, zero or more.
        """
        timeout = check_wait_timeout(timeout)
        check_run_id(self.id)
        deadline = None if timeout is None else time.monotonic() + timeout
        pubsub = None
        try:
            pubsub = redis_client().pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            pubsub.subscribe(KEY_RUN_DONE + self.id)
        except redis.RedisError:
            pubsub = None
        pause = 0.05
        try:
            ensure_schema_once()
            while True:
                status, result = _outcome(self.id)
                if result is not None:
                    return result
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RunWaitTimeoutError(
                        f"run {self.id} is still {status} after {timeout}s")
                step = pause if left is None else min(pause, left)
                if pubsub is not None:
                    try:
                        pubsub.get_message(timeout=step)
                    except redis.RedisError:
                        pubsub = None
                        time.sleep(step)
                else:
                    time.sleep(step)  # no Redis: poll SQL with backoff
                pause = min(pause * 2, 1.0)
        finally:
            if pubsub is not None:
                with contextlib.suppress(redis.RedisError):
                    pubsub.close()


def _fair() -> bool:
    return get_settings().start_order == StartOrder.FAIR


def _published(admitted: list[Admitted]) -> list[RunHandle]:
    if _fair():
        # The rows wait in the outbox; the fair relay publishes them in their org's turn.
        asked = fair_relay.ask() if any(a.outbox_id is not None for a in admitted) else True
        return [RunHandle(a.run_id, a.created, asked or a.outbox_id is None)
                for a in admitted]
    # Committed already, the rows marked as handed to us: if this publish fails they are
    # un-marked for the beat sweep (and a crash here leaves them to its resend).
    messages: list[Message] = [(a.outbox_id, TASK_START_ATTEMPT,
                                start_args(a.run_id, a.provider))
                               for a in admitted if a.outbox_id is not None]
    published = publish_admitted(messages) if messages else True
    return [RunHandle(a.run_id, a.created, published or a.outbox_id is None)
            for a in admitted]


def submit_run(play: str | Path, input: Any = None, *, org_id: str,
               idempotency_key: str | None = None, placement: str | None = None) -> RunHandle:
    """Admit a run; with a key already used by this org, return that run and write nothing.

    `placement` names a placement policy (`playrun placement set`); without it the org's
    default applies, then PLAYRUN_PLACEMENT_DEFAULT. An unknown name: PLACEMENT_UNKNOWN.
    """
    ensure_schema_once()
    if not _fair():
        return _published([admit(play, input, org_id, idempotency_key, handed_off=True,
                                 placement=placement)])[0]
    # Fair order with no start waiting: this one goes out at once, as a pass would send it.
    admitted = admit(play, input, org_id, idempotency_key, handed_off=fair_relay.skip_queue,
                     placement=placement)
    if admitted.handed_off and admitted.outbox_id is not None:
        sent = fair_relay.send_skipped((admitted.outbox_id, TASK_START_ATTEMPT,
                                        start_args(admitted.run_id, admitted.provider)), org_id)
        return RunHandle(admitted.run_id, admitted.created, sent)
    return _published([admitted])[0]


def submit_runs(runs: Sequence[RunRequest | Mapping[str, Any]]) -> list[RunHandle]:
    """Admit many runs in one transaction and publish their starts in one pipeline.

    Each item is a RunRequest, or a dict with its fields: `play` and `org_id`, and
    optionally `input` and `idempotency_key`, checked exactly as submit_run checks them.
    One bad item refuses the whole batch before anything is written: the error says
    which (`item`). A key
    the org used before, or earlier in the same batch, returns that run (created=False).
    Handles come back in the order of the items.
    """
    ensure_schema_once()
    return _published(admit_many(runs, handed_off=not _fair()))


def _view(run: Run, attempts: list[Attempt]) -> RunView:
    return RunView(
        id=run.id, org_id=run.org_id, status=RunStatus(run.status), code=run.code,
        error=run.error, output=run.output, created_at=run.created_at,
        finished_at=run.finished_at,
        attempts=[AttemptView(a.generation, AttemptState(a.state), a.sandbox_id,
                              a.started_at, a.ended_at, a.last_heartbeat_at,
                              a.lease_expires_at if a.runner_started_at is not None
                              and a.state == AttemptState.ACTIVE else None)
                  for a in attempts],
        play_path=run.play_path, idempotency_key=run.idempotency_key,
        deferral_count=run.deferral_count,
    )


_OUTCOME = sa.select(Run.status, Run.output, Run.error, Run.code).where(
    Run.id == sa.bindparam("run_id"))


def _outcome(run_id: str) -> tuple[str, RunResult | None]:
    """The run's status, and its result once terminal: one small read per look."""
    # Read-only: on SQLite it must not take the write lock (tasks.store.db).
    with get_engine().execution_options(playrun_readonly=True).connect() as conn:
        row = conn.execute(_OUTCOME, {"run_id": run_id}).first()
    if row is None:
        raise RunNotFoundError(f"no run with id {run_id}")
    status, output, error, code = row
    if status in TERMINAL_STATUSES:
        return status, RunResult(RunStatus(status), output, error, code)
    return status, None


def get_run(run_id: str) -> RunView:
    """The run with this id, with its attempts (`resolve_run_id` turns a prefix into an id)."""
    run_id = check_run_id(run_id)
    ensure_schema_once()
    with session_scope(readonly=True) as session:
        run = session.get(Run, run_id)
        if run is None:
            raise RunNotFoundError(f"no run with id {run_id}")
        attempts = list(session.scalars(
            sa.select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.generation)))
        return _view(run, attempts)


def list_runs(limit: int = 50, org_id: str | None = None, *, status: str | None = None,
              code: str | None = None, since: datetime | None = None,
              until: datetime | None = None, before: str | None = None) -> list[RunView]:
    """Runs newest first (without their attempts), filtered; `since` <= created_at <
    `until` (aware datetimes). For the next page pass `before=run_cursor(last view)`."""
    query = RunFilter.check(limit, org_id, status=status, code=code, since=since,
                            until=until, before=before)
    return [_view(r, []) for r in find_runs(query)]


def run_events(run_id: str, *, after: int | None = None,
               limit: int = DEFAULT_EVENTS_PAGE) -> list[ledger.Event]:
    """The run's ledger in order, one page: at most `limit` events (up to
    MAX_EVENTS_PAGE), those after the event whose `seq` is `after` (None: from the start).

    Read the next page with `after=events[-1].seq`; a short page is the end.
    """
    run_id = check_run_id(run_id)
    after = None if after is None else check_count(after, "after", maximum=MAX_SQL_BIGINT)
    limit = check_count(limit, "limit", minimum=1, maximum=MAX_EVENTS_PAGE)
    ensure_schema_once()
    with session_scope(readonly=True) as session:
        if session.get(Run, run_id) is None:
            raise RunNotFoundError(f"no run with id {run_id}")
        return ledger.read(session, run_id, after=after, limit=limit)


def cancel_run(run_id: str) -> RunView:
    """Ask for cancellation; the outcome is `cancelled` unless a terminal already won."""
    run_id = check_run_id(run_id)
    ensure_schema_once()
    with session_scope() as session:
        run = lock_run(session, run_id)
        if run is None:
            raise RunNotFoundError(f"no run with id {run_id}")
        first = run.status not in TERMINAL_STATUSES and run.cancel_requested_at is None
        if first:
            run.cancel_requested_at = db_now()
            ledger.append(session, run_id, EventKind.CANCEL_REQUESTED, {})
    if first:
        # Queued or deferred runs have nobody watching: settle here (a no-op if active).
        settle_unattended(run_id, CANCELLED_OUTCOME)
        launched = _launched_host(run_id)
        if launched is not None:
            # The sandbox's host deletes it, then writes `cancelled`; the runner also hears
            # of it on its next heartbeat. A lost message is resent by the reaper.
            with contextlib.suppress(Exception):
                send(TASK_CANCEL_ATTEMPT, [run_id], launched or QUEUE)
    return get_run(run_id)


def _launched_host(run_id: str) -> str | None:
    """The queue of the host running this run's runner ("" for any), None if not launched."""
    with session_scope(readonly=True) as session:
        row = session.execute(sa.select(Attempt.host_queue).join(Run, Run.id == Attempt.run_id)
                              .where(Attempt.run_id == run_id,
                                     Attempt.generation == Run.current_generation,
                                     Attempt.state == AttemptState.ACTIVE,
                                     Attempt.runner_started_at.is_not(None))).first()
    return None if row is None else (row[0] or "")


def run_again(run_id: str, *, idempotency_key: str | None = None) -> RunHandle:
    """A new run of `run_id`'s stored play bundle with the same input and org."""
    ensure_schema_once()
    admitted = admit_again(run_id, idempotency_key)
    if admitted.outbox_id is not None and _fair():
        fair_relay.pump()
    elif admitted.outbox_id is not None:
        # Its outbox row is not marked sent yet: the relay claims it, then publishes.
        publish_due(ids=[admitted.outbox_id])
    return RunHandle(admitted.run_id, admitted.created)
