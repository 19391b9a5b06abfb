"""Outcomes, and reading a runner's result file into one (pushed or read, same path)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.constants import (
    CANCELLED_CODE,
    MAX_OUTPUT_BYTES,
    MAX_RESULT_FILE_BYTES,
    OUTPUT_INVALID,
    PLAY_ERROR,
    PLAY_NOT_FOUND,
    RUN_TIMEOUT,
    RUNTIME_RUNNER_LOST,
    RunStatus,
)
from tasks.errors import DocumentInvalidError
from tasks.parse import untrusted
from tasks.parse.untrusted import encoded_size, storable_text
from tasks.protocol import MAX_ERROR_CHARS, RUNNER_CODES

# A result's code is kept only if a runner may fail with it; any other is PLAY_ERROR.
KNOWN_CODES = RUNNER_CODES | {PLAY_NOT_FOUND}


@dataclass(frozen=True)
class Outcome:
    status: RunStatus
    code: str | None = None
    error: str | None = None
    output: Any = None

    @classmethod
    def failed(cls, code: str, error: str) -> Outcome:
        return cls(RunStatus.FAILED, code, storable_text(str(error)[:MAX_ERROR_CHARS]))


CANCELLED_OUTCOME = Outcome(RunStatus.CANCELLED, CANCELLED_CODE, "the run was cancelled")


def from_document(doc: Any) -> Outcome:
    """A decoded result document (read from the sandbox or pushed) as an outcome."""
    if not isinstance(doc, dict):
        return Outcome.failed(OUTPUT_INVALID, "the result is not a JSON object")
    if doc.get("status") == RunStatus.SUCCEEDED and "output" in doc:
        size = encoded_size(doc["output"])
        if size > MAX_OUTPUT_BYTES:
            return Outcome.failed(
                OUTPUT_INVALID, f"output is {size} bytes; the limit is {MAX_OUTPUT_BYTES}"
            )
        return Outcome(RunStatus.SUCCEEDED, output=doc["output"])
    if doc.get("status") == RunStatus.FAILED and isinstance(doc.get("code"), str):
        code = doc["code"] if doc["code"] in KNOWN_CODES else PLAY_ERROR
        return Outcome.failed(code, str(doc.get("error") or code))
    return Outcome.failed(OUTPUT_INVALID, "the result has an unknown shape")


def from_result(raw: bytes, *, truncated: bool = False) -> Outcome:
    """Turn a runner's result file into an outcome; anything malformed is OUTPUT_INVALID."""
    if truncated:
        return Outcome.failed(OUTPUT_INVALID, "the play's result is larger than the limit")
    try:
        doc = untrusted.parse(raw, max_bytes=MAX_RESULT_FILE_BYTES)
    except DocumentInvalidError as exc:
        return Outcome.failed(OUTPUT_INVALID, f"the result is not usable: {exc.message}")
    return from_document(doc)


def without_result(exit_code: int | None, timed_out: bool) -> Outcome:
    """The runner ended, or vanished, and left no result behind."""
    if timed_out:
        return Outcome.failed(RUN_TIMEOUT, "the play ran past its time limit and was stopped")
    if exit_code is None:
        how = "vanished"
    elif exit_code < 0:  # a signal, as Python and the supervisor report one
        how = f"was killed by signal {-exit_code}"
    else:
        how = f"exited with code {exit_code}"
    return Outcome.failed(RUNTIME_RUNNER_LOST, f"the runner {how} without a result")
