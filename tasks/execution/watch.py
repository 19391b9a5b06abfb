"""Watch a detached runner: record its progress, renew the lease, settle when it ends.

A watch polls in place for a short window and then hands off to a fresh Celery
task, so a long play never holds a worker slot.
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
    CANCELLED,
    CANCELLED_CODE,
    EV_PROGRESS,
    EVENTS_FILE,
    MAX_EVENTS_READ_BYTES,
    MAX_RESULT_FILE_BYTES,
    RESULT_FILE,
    RUNTIME_RUNNER_LOST,
)
from tasks.db import session_scope
from tasks.errors import FenceLostError
from tasks.execution.progress import parse_lines
from tasks.fence import Fence, hold, renew
from tasks.release.attempt import release_attempt
from tasks.sandbox import ProcessStatus, SandboxNotFoundError, SandboxProvider
from tasks.settings import Settings
from tasks.settlement.outcome import Outcome, from_result, without_result
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


def _record_progress(provider: SandboxProvider, fence: Fence, settings: Settings) -> Tick:
    """One fenced step: new progress lines, lease renewal, and what the run asks of us."""
    with session_scope() as session:
        run, attempt = hold(session, fence)
        if attempt.sandbox_id is None:
            raise FenceLostError("attempt has no sandbox to watch")
        chunk = provider.read_file(attempt.sandbox_id, EVENTS_FILE,
                                   offset=attempt.events_offset,
                                   max_bytes=MAX_EVENTS_READ_BYTES)
        if chunk is not None and chunk.data:
            found, used = parse_lines(chunk.data)
            for item in found:
                ledger.append(session, fence.run_id, EV_PROGRESS,
                              {"message": item.message, "fields": item.fields},
                              fence.generation)
            attempt.events_offset += used
        renew(session, fence, settings.lease_seconds)
        past = session.scalar(sa.select(Attempt.runner_deadline < db_now()).where(
            Attempt.id == attempt.id))
        return Tick(attempt.sandbox_id, run.cancel_requested_at is not None, bool(past))


def _outcome_from_sandbox(provider: SandboxProvider, sandbox_id: str,
                          status: ProcessStatus) -> Outcome:
    """Read what the runner left; never runs anything in the sandbox."""
    found = provider.read_file(sandbox_id, RESULT_FILE, max_bytes=MAX_RESULT_FILE_BYTES)
    if found is not None and found.data:
        return from_result(found.data, truncated=found.truncated)
    return without_result(status.exit_code, status.timed_out)


def _poll(provider: SandboxProvider, sandbox_id: str) -> ProcessStatus:
    try:
        return provider.poll(sandbox_id)
    except SandboxNotFoundError:
        return ProcessStatus(state="missing")


def finish(fence: Fence, outcome: Outcome, reason: str) -> None:
    """Settle (first write wins) and release what the attempt held, whoever won."""
    try:
        result = settle(fence, outcome, reason=reason)
        if not result.won:
            log.info("run %s was already %s", fence.run_id, result.outcome.status)
    finally:
        release_attempt(fence.run_id, fence.generation)


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
            # The sandbox goes before the final run write (SPEC 4.10).
            provider.delete(tick.sandbox_id)
            finish(fence, Outcome(CANCELLED, CANCELLED_CODE, "the run was cancelled"),
                   "cancelled")
            return "settled"
        if status.state != "running":
            try:
                _record_progress(provider, fence, settings)  # the last lines before exit
            except FenceLostError:
                return "fence_lost"
            finish(fence, _outcome_from_sandbox(provider, tick.sandbox_id, status), "ended")
            return "settled"
        if tick.past_deadline:
            outcome = _outcome_from_sandbox(provider, tick.sandbox_id, status)
            provider.delete(tick.sandbox_id)
            if outcome.code == RUNTIME_RUNNER_LOST:
                outcome = Outcome.failed(
                    RUNTIME_RUNNER_LOST, "the runner passed its deadline without a result")
            finish(fence, outcome, "runner_lost")
            return "settled"
        if time.monotonic() >= deadline:
            return "again"
        time.sleep(pause)  # polling a child process with a deadline; nothing to await
        pause = min(pause * 1.5, MAX_PAUSE_S)


def current_fence(run_id: str) -> Fence | None:
    """The active attempt's fence, for maintenance that adopts a watch."""
    with session_scope() as session:
        row = session.execute(
            sa.select(Attempt.generation, Attempt.lease_token)
            .join(Run, Run.id == Attempt.run_id)
            .where(Attempt.run_id == run_id, Attempt.generation == Run.current_generation,
                   Attempt.state == "active")
        ).first()
    return Fence(run_id, row[0], row[1]) if row else None
