"""The play's side of a run: the `ctx` a play receives, and the runner's bounded stdout.

Standard library only; copied into each sandbox as playrun_context.py beside runner.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING or __package__:  # the host imports the runner's files as tasks.execution.*
    from tasks.protocol import EVENTS_FILE, MAX_EVENT_BYTES
else:  # in the sandbox they are flat files beside runner.py
    from playrun_protocol import EVENTS_FILE, MAX_EVENT_BYTES

MAX_EVENTS_FILE_BYTES = 8 * 1024 * 1024
MAX_STDOUT_BYTES = 1024 * 1024


class BoundedWriter(io.TextIOBase):
    """Text stream keeping the first MAX_STDOUT_BYTES in a file and counting the rest."""

    def __init__(self, path: Path, limit: int = MAX_STDOUT_BYTES) -> None:
        self._file: BinaryIO = open(path, "ab")  # noqa: SIM115 - lives for the whole run
        self._limit = limit
        self._lock = threading.Lock()
        self.written = 0
        self.dropped = 0

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def write(self, s: str) -> int:
        data = str(s).encode("utf-8", "backslashreplace")
        with self._lock:
            keep = data[: max(self._limit - self.written, 0)]
            if keep:
                try:
                    self._file.write(keep)
                    self.written += len(keep)
                except OSError:  # a full sandbox disk: the play's print must not raise
                    keep = b""
            self.dropped += len(data) - len(keep)
        return len(s)

    def flush(self) -> None:
        with self._lock, contextlib.suppress(OSError):  # as write: a full disk drops output
            if not self._file.closed:
                self._file.flush()

    def finish(self) -> None:
        with self._lock:
            if self.dropped:
                note = f"\n[playrun: output truncated, {self.dropped} more bytes dropped]\n"
                self._file.write(note.encode())
            self._file.flush()


def encode_json(text: str) -> bytes:
    """UTF-8 for JSON text; lone surrogates (only possible inside strings) become \\u escapes."""
    return text.encode("utf-8", "backslashreplace")


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError, RecursionError):
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001 - a broken __repr__ must not break logging
            text = f"<unrepresentable {type(value).__name__}>"
        return text[:MAX_EVENT_BYTES]


class Context:
    """The `ctx` a play receives."""

    def __init__(self, directory: Path, uplink: Any = None) -> None:
        self._uplink = uplink
        self.run_id: str | None = os.environ.get("PLAYRUN_RUN_ID")
        generation = os.environ.get("PLAYRUN_GENERATION")
        self.generation: int | None = (
            int(generation) if generation is not None and generation.isdigit() else None
        )
        self.org_id: str | None = os.environ.get("PLAYRUN_ORG_ID")
        self._events: BinaryIO = open(directory / EVENTS_FILE, "ab")  # noqa: SIM115
        self._lock = threading.Lock()
        self._seq = 0
        self._bytes = 0
        self._dropped = 0
        self._steps: Any = None  # playrun_steps.Steps, made on the first ctx.step
        self._deadline = time.monotonic()  # the run's wall-clock end, set by the runner
        # Set by a runtime sheet that stopped this run: (code, error); the run fails with it.
        self.halted: tuple[str, str] | None = None

    def step(self, key: str, fn: Any, ttl: float | None = None) -> Any:
        """`fn()`'s JSON output, computed once per (org, play, key): a completed work
        receipt is returned without calling fn. `ttl` seconds let a receipt expire."""
        if self._steps is None:
            # Imported on first use: plays without steps do not pay for it at start-up.
            try:
                if TYPE_CHECKING or __package__:
                    from tasks.execution import runner_steps as steps
                else:
                    import playrun_steps as steps
            except ImportError:
                raise RuntimeError("ctx.step needs playrun_steps.py beside runner.py") from None
            self._steps = steps.Steps(self._uplink, self._deadline)
        return self._steps.step(key, fn, ttl)

    def failure_code(self, exc: BaseException) -> str | None:
        """The run's code for an exception that escaped the play, when it is a step's."""
        return None if self._steps is None else self._steps.code_of(exc)

    def sheet(self, table: str) -> Any:
        """The play's runtime sheet `table` (playrun_sheets.py, beside this file)."""
        if TYPE_CHECKING or __package__:
            from tasks.execution import runner_sheets as sheets
        else:
            import playrun_sheets as sheets
        return sheets.Sheet(self, table)

    def log(self, message: str, **fields: Any) -> None:
        """Append one progress event to events.jsonl (bounded per event and in total)."""
        text = str(message)
        clean = {str(k): _jsonable(v) for k, v in fields.items()}
        with self._lock:
            if self._events.closed:  # a thread the play left logging after the end
                return
            self._seq += 1
            event: dict[str, Any] = {
                "seq": self._seq,
                "kind": "progress",
                "message": text,
                "fields": clean,
                "t": time.time(),
            }
            line = encode_json(json.dumps(event, ensure_ascii=False)) + b"\n"
            if len(line) > MAX_EVENT_BYTES:
                # Keep a preview of the message; fields cannot be cut meaningfully.
                event["fields"] = {}
                event["truncated"] = True
                budget = MAX_EVENT_BYTES // 2
                while len(line) > MAX_EVENT_BYTES and budget > 0:
                    event["message"] = text[:budget]
                    line = encode_json(json.dumps(event, ensure_ascii=False)) + b"\n"
                    budget //= 2
            if self._uplink is not None:
                self._uplink.add({k: event[k] for k in ("seq", "message", "fields", "t")})
            if self._dropped:
                self._dropped += 1
                return
            if self._bytes + len(line) > MAX_EVENTS_FILE_BYTES:
                self._dropped = 1
                note = {
                    "seq": self._seq,
                    "kind": "dropped",
                    "message": "events limit reached; further events are dropped",
                    "t": time.time(),
                }
                line = json.dumps(note).encode() + b"\n"
            try:
                self._events.write(line)
                self._events.flush()
            except OSError as exc:
                # A full sandbox disk must not fail the play: the gateway has the event
                # (added above); only the file's copy is lost, and counted as dropped.
                self._dropped = self._dropped or 1
                print(f"runner: events file not written: {exc}", file=sys.__stderr__)
                return
            self._bytes += len(line)

    def close(self) -> None:
        with self._lock:
            self._events.close()
