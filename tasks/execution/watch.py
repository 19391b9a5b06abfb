"""Watch a detached runner: record its progress, renew the lease, settle when it ends.

A watch polls in place for a short window and then hands off to a fresh Celery
task, so a long play never holds a worker slot. Provider reads happen outside
database transactions; the consumed byte offset is a compare-and-set, so two
watchers of one attempt never record a line twice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

import sqlalchemy as sa

from models import Attempt, Run, db_now
from tasks import ledger
from tasks.constants import (
    ATTEMPT_ACTIVE,
    EV_PROGRESS,
    EVENTS_FILE,
    MAX_EVENTS_READ_BYTES,
    MAX_RESULT_FILE_BYTES,
    OUTPUT_INVALID,
    RESULT_FILE,
    RUNTIME_RUNNER_LOST,
)
from tasks.db import session_scope
from tasks.errors import FenceLostError
from tasks.execution.progress import parse_lines
from tasks.fence import Fence, hold, renew
from tasks.release.attempt import release_attempt
from tasks.release.sandboxes import release_sandboxes
from tasks.sandbox import ProcessStatus, ProviderError, SandboxNotFoundError, SandboxProvider
from tasks.settings import Settings
from tasks.settlement.outcome import CANCELLED_OUTCOME, Outcome, from_result, without_result
from tasks.settlement.terminal import settle

log = logging.getLogger("playrun.watch")

WatchResult = Literal["settled", "again", "fence_lost"]
TICK_EVERY_S = 0.5
MAX_PAUSE_S = 0.1


@dataclass(frozen=True)
class Tick:
    sandbox_id: str
    cancel_requested: bool
    past_deadline: bool


def _where(fence: Fence) -> tuple[str, int]:
    with session_scope(readonly=True) as session:
        row = session.execute(sa.select(Attempt.sandbox_id, Attempt.events_offset).where(
            Attempt.run_id == fence.run_id, Attempt.generation == fence.generation,
            Attempt.lease_token == fence.lease_token)).first()
    if row is None or row[0] is None:
        raise FenceLostError("the attempt has no sandbox to watch")
    return row[0], row[1]


def _read_events(provider: SandboxProvider, sandbox_id: str, offset: int) -> bytes:
    try:
        chunk = provider.read_file(sandbox_id, EVENTS_FILE, offset=offset,
                                   max_bytes=MAX_EVENTS_READ_BYTES)
    except ProviderError as exc:  # gone or unreadable: progress is best effort
        log.info("progress of sandbox %s unreadable: %s", sandbox_id, exc)
        return b""
    return chunk.data if chunk is not None else b""


def _record_progress(provider: SandboxProvider, fence: Fence, settings: Settings) -> Tick:
    """One fenced step: new progress lines, lease renewal, and what the run asks of us."""
    sandbox_id, offset = _where(fence)
    found, used = parse_lines(_read_events(provider, sandbox_id, offset))
    with session_scope() as session:
        run, attempt = hold(session, fence)
        if used and attempt.events_offset == offset:
            for item in found:
                ledger.append(session, fence.run_id, EV_PROGRESS,
                              {"message": item.message, "fields": item.fields},
                              fence.generation)
            attempt.events_offset = offset + used
        renew(session, fence, settings.lease_seconds)
        past = session.scalar(sa.select(Attempt.runner_deadline < db_now()).where(
            Attempt.id == attempt.id))
        return Tick(sandbox_id, run.cancel_requested_at is not None, bool(past))


def _poll(provider: SandboxProvider, sandbox_id: str) -> ProcessStatus:
    try:
        return provider.poll(sandbox_id)
    except SandboxNotFoundError:
        return ProcessStatus(state="missing")


def outcome_from_sandbox(provider: SandboxProvider, sandbox_id: str,
                         status: ProcessStatus) -> Outcome:
    """Read what the runner left; never runs anything in the sandbox. Raises only on a
    transient provider error, so that a later watcher reads it again."""
    try:
        found = provider.read_file(sandbox_id, RESULT_FILE, max_bytes=MAX_RESULT_FILE_BYTES)
    except SandboxNotFoundError:
        found = None
    except ProviderError as exc:
        if exc.kind != "other":
            raise  # transient (transport, rate limited ...): a later watcher reads it again
        # A definite refusal, e.g. the play swapped its result for a symlink.
        return Outcome.failed(OUTPUT_INVALID, f"the result file could not be read: {exc}")
    if found is not None and found.data:
        return from_result(found.data, truncated=found.truncated)
    return without_result(status.exit_code, status.timed_out)


def inspect(provider: SandboxProvider, fence: Fence) -> Outcome:
    """The lost-runner inspection: a result found in the sandbox wins, else RUNNER_LOST.
    Never raises: it is the last word on a runner nobody could watch."""
    try:
        sandbox_id, _ = _where(fence)
    except FenceLostError:
        return Outcome.failed(RUNTIME_RUNNER_LOST, "the runner has no sandbox on record")
    try:
        outcome = outcome_from_sandbox(provider, sandbox_id, _poll(provider, sandbox_id))
    except ProviderError as exc:
        return Outcome.failed(RUNTIME_RUNNER_LOST,
                              f"the runner passed its deadline; its sandbox is unreadable: {exc}")
    if outcome.code == RUNTIME_RUNNER_LOST:
        return Outcome.failed(RUNTIME_RUNNER_LOST,
                              "the runner passed its deadline without a result")
    return outcome


def _flags(fence: Fence) -> tuple[bool, bool]:
    """(this holder is still the active one, a cancel was requested)."""
    with session_scope(readonly=True) as session:
        row = session.execute(
            sa.select(Attempt.state == ATTEMPT_ACTIVE, Run.cancel_requested_at.is_not(None))
            .join(Run, Run.id == Attempt.run_id)
            .where(Attempt.run_id == fence.run_id, Attempt.generation == fence.generation,
                   Attempt.lease_token == fence.lease_token)).first()
    return (bool(row[0]), bool(row[1])) if row else (False, False)


def finish(fence: Fence, outcome: Outcome, reason: str) -> None:
    """Settle (first write wins), then release what this holder held, whoever won.

    With a cancel requested, the sandbox goes before the final run write (SPEC 4.10).
    If the write fails while this holder is still the active one (its lease merely ran
    out), nothing is released: the reaper adopts the attempt and settles it from the
    sandbox, which must still be there.
    """
    if _flags(fence)[1]:
        release_sandboxes(fence.run_id, fence.generation, fence.lease_token)
        outcome, reason = CANCELLED_OUTCOME, "cancelled"
    try:
        result = settle(fence, outcome, reason=reason)
    except Exception as exc:
        if _flags(fence)[0]:
            log.warning("run %s not settled yet (%s); left to the reaper", fence.run_id, exc)
        else:
            release_attempt(fence.run_id, fence.generation, fence.lease_token)
        if isinstance(exc, FenceLostError):
            return
        raise
    if not result.won:
        log.info("run %s was already %s", fence.run_id, result.outcome.status)
    release_attempt(fence.run_id, fence.generation, fence.lease_token)


def watch(fence: Fence, provider: SandboxProvider, settings: Settings,
          inline_s: float) -> WatchResult:
    deadline = time.monotonic() + inline_s
    pause = 0.01
    next_tick = 0.0
    tick: Tick | None = None
    while True:
        # Polling the sandbox is cheap; the fenced database step runs at most every
        # TICK_EVERY_S (or when the runner has ended), so a fast play settles quickly.
        if tick is None or time.monotonic() >= next_tick:
            try:
                tick = _record_progress(provider, fence, settings)
            except FenceLostError as exc:
                log.info("watch of run %s stops: %s", fence.run_id, exc)
                return "fence_lost"
            next_tick = time.monotonic() + TICK_EVERY_S
        status = _poll(provider, tick.sandbox_id)
        if tick.cancel_requested:
            # The sandbox goes before the final run write (SPEC 4.10); if the delete
            # fails here, the release after the write tries again.
            try:
                provider.delete(tick.sandbox_id)
            except ProviderError as exc:
                log.warning("cancel: sandbox %s not deleted yet: %s", tick.sandbox_id, exc)
            finish(fence, CANCELLED_OUTCOME, "cancelled")
            return "settled"
        if status.state != "running":
            try:
                _record_progress(provider, fence, settings)  # the last lines before exit
            except FenceLostError:
                return "fence_lost"
            finish(fence, outcome_from_sandbox(provider, tick.sandbox_id, status), "ended")
            return "settled"
        if tick.past_deadline:
            # Settle first, from what the sandbox holds; the release then deletes it.
            finish(fence, inspect(provider, fence), "runner_lost")
            return "settled"
        if time.monotonic() >= deadline:
            return "again"
        time.sleep(pause)  # polling a child process with a deadline; nothing to await
        pause = min(pause * 1.5, MAX_PAUSE_S)


def current_fence(run_id: str) -> Fence | None:
    """The active attempt's fence, for maintenance that adopts a watch."""
    with session_scope(readonly=True) as session:
        row = session.execute(
            sa.select(Attempt.generation, Attempt.lease_token)
            .join(Run, Run.id == Attempt.run_id)
            .where(Attempt.run_id == run_id, Attempt.generation == Run.current_generation,
                   Attempt.state == "active")
        ).first()
    return Fence(run_id, row[0], row[1]) if row else None
