"""Outcomes, and reading a runner's result file into one (pushed or read, same path)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tasks.constants import (
    CANCELLED,
    CANCELLED_CODE,
    FAILED,
    MAX_OUTPUT_BYTES,
    OUTPUT_INVALID,
    RUN_TIMEOUT,
    RUNTIME_RUNNER_LOST,
    SUCCEEDED,
)

_KNOWN_CODES = frozenset({
    "PLAY_NOT_FOUND", "PLAY_INVALID", "PLAY_ERROR", "OUTPUT_INVALID", "INPUT_INVALID",
    "RUN_TIMEOUT",
})
MAX_ERROR_CHARS = 8192


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_loads(raw: bytes | str) -> Any:
    """JSON as PostgreSQL's JSONB accepts it: NaN and Infinity are refused."""
    return json.loads(raw, parse_constant=_no_constants)


def clean(value: Any) -> Any:
    """Make play-supplied JSON storable everywhere: PostgreSQL text and JSONB refuse NUL
    characters and lone surrogates, so one odd string must not make a run unsettleable."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


@dataclass(frozen=True)
class Outcome:
    status: str
    code: str | None = None
    error: str | None = None
    output: Any = None

    @classmethod
    def failed(cls, code: str, error: str) -> Outcome:
        return cls(FAILED, code, clean(error[:MAX_ERROR_CHARS]))


CANCELLED_OUTCOME = Outcome(CANCELLED, CANCELLED_CODE, "the run was cancelled")


def from_result(raw: bytes, *, truncated: bool = False) -> Outcome:
    """Turn a runner's result document into an outcome; anything malformed is OUTPUT_INVALID."""
    if truncated:
        return Outcome.failed(OUTPUT_INVALID, "the play's result is larger than the limit")
    try:
        doc = strict_loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return Outcome.failed(OUTPUT_INVALID, f"the result file is not JSON: {exc}")
    if not isinstance(doc, dict):
        return Outcome.failed(OUTPUT_INVALID, "the result file is not a JSON object")
    if doc.get("status") == SUCCEEDED and "output" in doc:
        size = len(json.dumps(doc["output"], separators=(",", ":")).encode())
        if size > MAX_OUTPUT_BYTES:
            return Outcome.failed(OUTPUT_INVALID,
                                  f"output is {size} bytes; the limit is {MAX_OUTPUT_BYTES}")
        return Outcome(SUCCEEDED, output=clean(doc["output"]))
    if doc.get("status") == FAILED and isinstance(doc.get("code"), str):
        code = doc["code"] if doc["code"] in _KNOWN_CODES else "PLAY_ERROR"
        return Outcome.failed(code, str(doc.get("error") or code))
    return Outcome.failed(OUTPUT_INVALID, "the result file has an unknown shape")


def without_result(exit_code: int | None, timed_out: bool) -> Outcome:
    """The runner ended, or vanished, and left no result behind."""
    if timed_out:
        return Outcome.failed(RUN_TIMEOUT, "the play ran past its time limit and was stopped")
    how = "vanished" if exit_code is None else f"exited with code {exit_code}"
    return Outcome.failed(RUNTIME_RUNNER_LOST, f"the runner {how} without a result")
