"""`ctx.step(key, fn, ttl=None)` inside the sandbox: work receipts through the gateway.

Standard library only; copied into each sandbox as playrun_steps.py beside runner.py.
A completed receipt of (org, play, key) is returned without calling fn; otherwise this
call claims the receipt, runs fn and completes it with fn's JSON output. While another
run holds the receipt the call waits (polling the claim with backoff, up to the run's time
limit) and then reuses its output. Without a gateway (a runner started by hand) fn just
runs, with the same checks, and nothing is kept.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the host imports the runner's files as tasks.execution.*
    from tasks import protocol
    from tasks.execution import runner_client as client
else:  # in the sandbox they are flat files beside runner.py
    import playrun_client as client
    import playrun_protocol as protocol

MAX_KEY_CHARS = protocol.MAX_STEP_KEY_CHARS
MAX_OUTPUT_BYTES = protocol.MAX_STEP_OUTPUT_BYTES
MAX_TTL_S = protocol.MAX_STEP_TTL_S
MAX_ERROR_CHARS = 4000
# Waiting for another run's step: first pause, growth, longest pause (seconds).
WAIT_FIRST_S = 0.05
WAIT_GROWTH = 1.5
WAIT_MAX_S = 1.0
# Reporting a failed step is best effort: this long at most, then the release frees it.
FAIL_REPORT_S = 10.0


class StepError(Exception):
    """A step could not run or keep its result; `code` says why."""

    def __init__(self, code: str, message: str, *, refused: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.refused = refused  # the gateway's own code, when it refused the call


def code_of(exc: BaseException) -> str | None:
    """The run's failure code for an exception that escaped the play, if a step's."""
    return exc.code if isinstance(exc, StepError) else None


def check_key(key: Any) -> str:
    if not isinstance(key, str) or not key.strip():
        raise StepError(protocol.STEP_KEY_INVALID, "a step key must be a non-empty string")
    if len(key) > MAX_KEY_CHARS:
        raise StepError(
            protocol.STEP_KEY_INVALID,
            f"the step key is {len(key)} characters; the limit is {MAX_KEY_CHARS}",
        )
    if "\x00" in key:
        raise StepError(protocol.STEP_KEY_INVALID, "a step key must not contain NUL")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise StepError(
            protocol.STEP_KEY_INVALID, "a step key must be valid Unicode text"
        ) from None
    return key


def check_ttl(ttl: Any) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= MAX_TTL_S:
        raise StepError(
            protocol.STEP_INVALID, f"ttl must be a number of seconds in (0, {MAX_TTL_S}]"
        )
    return float(ttl)


def encode_output(value: Any) -> tuple[str | None, str | None]:
    """(JSON text, None) for a keepable output, else (None, why not)."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        return None, f"the step output is not JSON-serialisable: {exc}"
    size = len(text.encode("utf-8", "backslashreplace"))
    if size > MAX_OUTPUT_BYTES:
        return None, f"the step output is {size} bytes; the limit is {MAX_OUTPUT_BYTES}"
    return text, None


def _describe(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    except Exception:  # noqa: BLE001 - the play's __str__ may raise anything
        text = type(exc).__name__
    return text[:MAX_ERROR_CHARS]


class Steps:
    """The steps of one runner: `uplink` reaches the gateway (None: run by hand)."""

    def __init__(self, uplink: Any, deadline: float) -> None:
        self._uplink = uplink
        self._deadline = deadline  # time.monotonic() at the run's time limit
        self._lock = threading.Lock()
        # Keys being stepped in this process: (thread, done). A nested call with the same
        # key in the same thread could never finish; another thread waits for the first.
        self._active: dict[str, tuple[int, threading.Event]] = {}

    code_of = staticmethod(code_of)  # for the runner, which imports this module lazily

    def step(self, key: Any, fn: Callable[[], Any], ttl: Any = None) -> Any:
        key, ttl = check_key(key), check_ttl(ttl)
        if not callable(fn):
            raise StepError(protocol.STEP_INVALID, "fn must be callable with no arguments")
        me = threading.get_ident()
        while True:
            with self._lock:
                holder = self._active.get(key)
                if holder is None:
                    done = threading.Event()
                    self._active[key] = (me, done)
                    break
            if holder[0] == me:
                raise StepError(
                    protocol.STEP_RECURSIVE,
                    f"step {key[:200]!r} calls itself: its fn called ctx.step with the same key",
                )
            if not holder[1].wait(max(self._deadline - time.monotonic(), 0)):
                raise StepError(
                    protocol.STEP_UNAVAILABLE,
                    f"step {key[:200]!r} is still running in another thread at the time limit",
                )
        try:
            return self._run(key, fn, ttl)
        finally:
            with self._lock:
                self._active.pop(key, None)
            done.set()

    # --- one step ----------------------------------------------------------------------

    def _run(self, key: str, fn: Callable[[], Any], ttl: float | None) -> Any:
        if self._uplink is None:
            return self._kept(key, None, fn())
        claim_id = uuid.uuid4().hex
        answer = self._claim(key, claim_id)
        if answer.get("state") == "reuse":
            return answer.get("output")
        try:
            output = fn()
        except Exception as exc:
            self._report_failure(key, claim_id, code_of(exc) or protocol.PLAY_ERROR, _describe(exc))
            raise
        # A BaseException (the time limit, SystemExit) is not reported: the run ends, and
        # its release frees the receipt.
        value = self._kept(key, claim_id, output)
        try:
            self._call(
                {
                    "action": protocol.ACTION_STEP_COMPLETE,
                    "key": key,
                    "claim_id": claim_id,
                    "output": value,
                    "ttl_s": ttl,
                },
                self._deadline,
            )
        except StepError as exc:
            if exc.refused in (
                protocol.OUTPUT_INVALID,
                protocol.GATEWAY_BAD_REQUEST,
                protocol.GATEWAY_BODY_TOO_LARGE,
            ):
                self._report_failure(key, claim_id, protocol.OUTPUT_INVALID, exc.message)
                raise StepError(
                    protocol.OUTPUT_INVALID, f"the step output was refused: {exc.message}"
                ) from None
            raise
        return value

    def _kept(self, key: str, claim_id: str | None, output: Any) -> Any:
        """fn's output as a receipt keeps it (JSON round trip, so a reuse returns the same)."""
        text, problem = encode_output(output)
        if text is None:
            if claim_id is not None:
                self._report_failure(key, claim_id, protocol.OUTPUT_INVALID, str(problem))
            raise StepError(protocol.OUTPUT_INVALID, f"step {key[:200]!r}: {problem}")
        return json.loads(text)

    def _claim(self, key: str, claim_id: str) -> dict[str, Any]:
        pause = WAIT_FIRST_S
        while True:
            answer = self._call(
                {"action": protocol.ACTION_STEP_CLAIM, "key": key, "claim_id": claim_id},
                self._deadline,
            )
            state = answer.get("state") if isinstance(answer, dict) else None
            if state in ("reuse", "run"):
                return dict(answer)
            if state != "wait":
                raise StepError(protocol.STEP_REFUSED, f"the gateway answered {str(answer)[:200]}")
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise StepError(
                    protocol.STEP_UNAVAILABLE,
                    f"step {key[:200]!r} is still held by another run at the time limit",
                )
            time.sleep(min(pause * client.jitter(), left))
            pause = min(pause * WAIT_GROWTH, WAIT_MAX_S)

    def _report_failure(self, key: str, claim_id: str, code: str, error: str) -> None:
        # If this fails, the step stays held until the run ends; its release frees it.
        with contextlib.suppress(StepError):
            self._call(
                {
                    "action": protocol.ACTION_STEP_FAIL,
                    "key": key,
                    "claim_id": claim_id,
                    "code": code,
                    "error": error[:MAX_ERROR_CHARS],
                },
                min(self._deadline, time.monotonic() + FAIL_REPORT_S),
            )

    def _call(self, body: dict[str, Any], deadline: float) -> Any:
        """One action, retried while the gateway is unavailable; refusals are StepErrors."""
        try:
            return client.call_until(self._uplink, body, deadline)
        except client.Refused as exc:
            code = exc.code
            raise StepError(
                code if code == protocol.RECEIPT_NOT_HELD else protocol.STEP_REFUSED,
                f"{body['action']} refused: {exc}",
                refused=code,
            ) from None
        except client.Unavailable as exc:
            raise StepError(
                protocol.STEP_UNAVAILABLE, f"the gateway is unreachable: {exc}"
            ) from None
