"""Inspect a sandbox whose runner went quiet: read what it left, never run anything.

The verdict is an outcome to settle (a result file found, or the runner gone without
one), to keep waiting while the runner is still running (the gateway was unreachable),
or that the runner never started (its worker died between recording the launch and
exec), so that the run is safely tried again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tasks.constants import MAX_RESULT_FILE_BYTES, OUTPUT_INVALID, RESULT_FILE, RUNTIME_RUNNER_LOST
from tasks.sandbox import ProcessStatus, ProviderError, SandboxNotFoundError, SandboxProvider
from tasks.settlement.outcome import Outcome, from_result, without_result


class Verdict(enum.Enum):
    SETTLE = "settle"
    KEEP = "keep"  # still running, no result: the gateway was unreachable
    NEVER_RAN = "never_ran"  # no process was ever started: nothing of the play ran


@dataclass(frozen=True)
class Inspected:
    verdict: Verdict
    outcome: Outcome | None = None


KEEP = Inspected(Verdict.KEEP)
NEVER_RAN = Inspected(Verdict.NEVER_RAN)


def poll(provider: SandboxProvider, sandbox_id: str) -> ProcessStatus:
    try:
        return provider.poll(sandbox_id)
    except SandboxNotFoundError:
        return ProcessStatus(state="missing")


def outcome_from_sandbox(provider: SandboxProvider, sandbox_id: str,
                         status: ProcessStatus) -> Outcome:
    """What the runner left. Raises only on a transient provider error, so that a later
    inspection reads it again."""
    try:
        found = provider.read_file(sandbox_id, RESULT_FILE, max_bytes=MAX_RESULT_FILE_BYTES)
    except SandboxNotFoundError:
        found = None
    except ProviderError as exc:
        if exc.kind != "other":
            raise  # transient (transport, rate limited ...): read again later
        # A definite refusal, e.g. the play swapped its result for a symlink.
        return Outcome.failed(OUTPUT_INVALID, f"the result file could not be read: {exc}")
    if found is not None and found.data:
        return from_result(found.data, truncated=found.truncated)
    return without_result(status.exit_code, status.timed_out)


def inspect(provider: SandboxProvider, sandbox_id: str | None, *,
            past_deadline: bool, reported: bool = False) -> Inspected:
    """The lost-runner verdict. A result file is final as soon as it exists (the runner
    writes it before it pushes). Past the run's deadline the verdict is final whatever the
    sandbox says; before it, a runner still running without a result is kept. `reported`:
    the sandbox's supervisor reported the exit (else its heartbeats stopped)."""
    if sandbox_id is None:
        return _settle(Outcome.failed(RUNTIME_RUNNER_LOST, "the runner has no sandbox on record"))
    try:
        status = poll(provider, sandbox_id)
        if status.state == "never_started":
            return NEVER_RAN
        outcome = outcome_from_sandbox(provider, sandbox_id, status)
        if status.state == "running" and not past_deadline \
                and outcome.code == RUNTIME_RUNNER_LOST:
            return KEEP
    except ProviderError as exc:
        if not past_deadline:
            raise
        return _settle(Outcome.failed(
            RUNTIME_RUNNER_LOST,
            f"the runner passed its deadline; its sandbox is unreadable: {exc}"))
    if outcome.code == RUNTIME_RUNNER_LOST:
        why = ("it " if reported else "its heartbeats stopped and it ") \
            + (outcome.error or "left no result").removeprefix("the runner ")
        return _settle(Outcome.failed(RUNTIME_RUNNER_LOST, f"the runner was lost: {why}"))
    return _settle(outcome)


def _settle(outcome: Outcome) -> Inspected:
    return Inspected(Verdict.SETTLE, outcome)
