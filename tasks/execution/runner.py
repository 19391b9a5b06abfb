"""The play runner: `python runner.py --timeout SECONDS` inside a sandbox directory.

Standard library only; copied into each sandbox as runner.py. It loads play.py, calls
`run(ctx, input)` and always tries to leave exactly one terminal result in result.json:
    {"status": "succeeded", "output": ...} or {"status": "failed", "code": ..., "error": ...}
Exit code 0 whenever a result was written, whatever the outcome.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any, BinaryIO

PLAY_FILE = "play.py"
INPUT_FILE = "input.json"
RESULT_FILE = "result.json"
EVENTS_FILE = "events.jsonl"
STDOUT_FILE = "stdout.log"

MAX_OUTPUT_BYTES = 1024 * 1024
MAX_EVENT_BYTES = 16 * 1024
MAX_EVENTS_FILE_BYTES = 8 * 1024 * 1024
MAX_STDOUT_BYTES = 1024 * 1024
MAX_ERROR_CHARS = 8 * 1024
TRACEBACK_FRAMES = 12
# If the play swallows the timeout (or ignores SIGALRM) the watchdog thread settles the run
# this long after the deadline; the supervisor's hard kill is the last resort.
WATCHDOG_GRACE_S = 2.0
# After the result file: progress gets this long to drain, the terminal push this long.
FLUSH_S = 15.0
PUSH_S = 60.0
STOPPED_EXIT = 3

PLAY_INVALID = "PLAY_INVALID"
PLAY_ERROR = "PLAY_ERROR"
OUTPUT_INVALID = "OUTPUT_INVALID"
INPUT_INVALID = "INPUT_INVALID"
RUN_TIMEOUT = "RUN_TIMEOUT"


class RunTimeout(BaseException):
    """Raised inside the play at the deadline; BaseException so `except Exception` misses it."""


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


def _encode(text: str) -> bytes:
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
                import playrun_steps  # beside runner.py in the sandbox
            except ImportError:
                raise RuntimeError("ctx.step needs playrun_steps.py beside runner.py") from None
            self._steps = playrun_steps.Steps(self._uplink, self._deadline)
        return self._steps.step(key, fn, ttl)

    def sheet(self, table: str) -> Any:
        """The play's runtime sheet `table` (playrun_sheets.py, beside this file)."""
        import playrun_sheets

        return playrun_sheets.Sheet(self, table)

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
            line = _encode(json.dumps(event, ensure_ascii=False)) + b"\n"
            if len(line) > MAX_EVENT_BYTES:
                # Keep a preview of the message; fields cannot be cut meaningfully.
                event["fields"] = {}
                event["truncated"] = True
                budget = MAX_EVENT_BYTES // 2
                while len(line) > MAX_EVENT_BYTES and budget > 0:
                    event["message"] = text[:budget]
                    line = _encode(json.dumps(event, ensure_ascii=False)) + b"\n"
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


class Runner:
    def __init__(self, directory: Path, timeout_s: float) -> None:
        self.dir = directory
        self.timeout_s = timeout_s
        self._result_lock = threading.Lock()
        self._settled = False
        self._owner_pid = os.getpid()
        self._armed = False
        self._timed_out = False
        self._done = threading.Event()
        self.stdout: BoundedWriter | None = None
        self.ctx: Context | None = None
        self.payload: bytes | None = None
        self.uplink: Any = None

    # --- the one terminal write ---------------------------------------------------------

    def settle(self, payload: bytes) -> bool:
        """Write result.json atomically, once; later calls are no-ops. False if it failed."""
        with self._result_lock:
            if self._settled or os.getpid() != self._owner_pid:
                # Settled already, or a child the play forked came back here: not its result.
                return True
            self._settled = True
            self.payload = payload
            path = self.dir / RESULT_FILE
            tmp = self.dir / f".{RESULT_FILE}.tmp"
            try:
                with open(tmp, "wb") as fh:
                    fh.write(payload)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
                dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            except OSError as exc:
                print(f"runner: cannot write {RESULT_FILE}: {exc}", file=sys.__stderr__)
                return False
            return True

    def fail(self, code: str, error: str) -> bool:
        if len(error) > MAX_ERROR_CHARS:
            error = error[: MAX_ERROR_CHARS - 20] + "\n...[truncated]"
        return self.settle(json.dumps({"status": "failed", "code": code, "error": error}).encode())

    # --- timeouts -----------------------------------------------------------------------

    def _on_alarm(self, signum: int, _frame: Any) -> None:
        if self._armed:
            self._armed = False
            self._timed_out = True
            raise RunTimeout("CPU time limit" if signum == signal.SIGXCPU else "wall clock")

    def _arm(self) -> None:
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.signal(signal.SIGXCPU, self._on_alarm)
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
        threading.Thread(target=self._watchdog, name="playrun-watchdog", daemon=True).start()

    def _disarm(self) -> None:
        self._armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)

    def _timeout_message(self) -> str:
        return f"the run exceeded its time limit of {self.timeout_s:g} s"

    def _watchdog(self) -> None:
        if self._done.wait(self.timeout_s + WATCHDOG_GRACE_S):
            return
        # The play ignored or swallowed the timeout: settle and end the process from here.
        self.fail(RUN_TIMEOUT, self._timeout_message())
        self._flush_all()
        try:
            self._push()
        except Exception as exc:  # noqa: BLE001 - the result file is there to inspect
            print(f"runner: push failed: {exc}", file=sys.__stderr__)
        os._exit(0)

    def _flush_all(self) -> None:
        if self.stdout is not None:
            try:
                self.stdout.finish()
            except Exception as exc:  # noqa: BLE001 - flushing must never block settling
                print(f"runner: cannot flush {STDOUT_FILE}: {exc}", file=sys.__stderr__)

    # --- phases -------------------------------------------------------------------------

    def _load(self) -> types.CodeType | str:
        try:
            source = (self.dir / PLAY_FILE).read_bytes().decode("utf-8")
        except FileNotFoundError:
            return f"{PLAY_FILE} not found"
        except UnicodeDecodeError as exc:
            return f"{PLAY_FILE} is not UTF-8: {exc}"
        except OSError as exc:
            return f"cannot read {PLAY_FILE}: {exc}"
        try:
            # dont_inherit: the runner's __future__ flags must not change the play's semantics.
            return compile(source, PLAY_FILE, "exec", dont_inherit=True)
        except SyntaxError as exc:
            return f"SyntaxError at line {exc.lineno}: {exc.msg}"
        except ValueError as exc:  # e.g. null bytes in the source
            return f"{PLAY_FILE} cannot be compiled: {exc}"

    def _read_input(self) -> tuple[Any, str | None]:
        try:
            return json.loads((self.dir / INPUT_FILE).read_bytes()), None
        except FileNotFoundError:
            return None, f"{INPUT_FILE} not found"
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            return None, f"{INPUT_FILE} is not valid JSON: {exc}"

    def _describe(self, exc: BaseException) -> str:
        try:
            head = f"{type(exc).__name__}: {exc}"
        except Exception:  # noqa: BLE001 - the play's __str__ may raise anything
            head = f"{type(exc).__name__}: <unprintable>"
        head = head[: MAX_ERROR_CHARS // 2]
        here = os.path.abspath(__file__)
        frames = [
            f
            for f in traceback.extract_tb(exc.__traceback__)
            if os.path.abspath(f.filename) != here
        ]
        tail = "".join(traceback.format_list(frames[-TRACEBACK_FRAMES:]))
        room = MAX_ERROR_CHARS - len(head) - 40
        if len(tail) > room:
            tail = "..." + tail[-room:]
        return f"{head}\nTraceback (most recent call last):\n{tail}".rstrip()

    def run(self) -> bool:
        code = self._load()
        if isinstance(code, str):
            return self.fail(PLAY_INVALID, code)
        value, problem = self._read_input()
        if problem is not None:
            return self.fail(INPUT_INVALID, problem)

        self.ctx = Context(self.dir, self.uplink)
        self.ctx._deadline = time.monotonic() + self.timeout_s
        module = types.ModuleType("play")
        module.__file__ = str(self.dir / PLAY_FILE)
        sys.modules["play"] = module
        sys.argv = [PLAY_FILE]
        try:
            try:
                self._arm()
                exec(code, module.__dict__)
                entry = getattr(module, "run", None)
                if not callable(entry):
                    self._disarm()
                    return self.fail(PLAY_INVALID, f"{PLAY_FILE} defines no callable run()")
                output = entry(self.ctx, value)
            finally:
                self._disarm()
                # What is left (serialising, writing) is bounded; the watchdog may stand down.
                self._done.set()
        except RunTimeout:
            return self.fail(RUN_TIMEOUT, self._timeout_message())
        except BaseException as exc:  # noqa: BLE001 - SystemExit etc. are play failures too
            if self._timed_out:
                return self.fail(RUN_TIMEOUT, self._timeout_message())
            if self.ctx.halted is not None:
                return self.fail(*self.ctx.halted)
            # Only a play that used ctx.step can raise a step's error.
            steps = sys.modules.get("playrun_steps")
            why = steps.code_of(exc) if steps is not None else None
            return self.fail(why or PLAY_ERROR, self._describe(exc))
        if self._timed_out:  # the play caught RunTimeout and returned anyway
            return self.fail(RUN_TIMEOUT, self._timeout_message())
        if self.ctx.halted:  # a sheet stopped the run and the play carried on regardless
            return self.fail(*self.ctx.halted)
        try:
            text = json.dumps(output, allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError) as exc:
            return self.fail(OUTPUT_INVALID, f"output is not JSON-serialisable: {exc}")
        data = _encode(text)
        if len(data) > MAX_OUTPUT_BYTES:
            return self.fail(
                OUTPUT_INVALID, f"output is {len(data)} bytes; the limit is {MAX_OUTPUT_BYTES}"
            )
        return self.settle(b'{"status": "succeeded", "output": ' + data + b"}")

    def _stop(self, why: str) -> None:
        """Cancelled, or no longer the attempt's owner: nothing more it does counts."""
        print(f"runner: stopping: {why}", file=sys.__stderr__, flush=True)
        self._flush_all()
        os._exit(STOPPED_EXIT)

    def _push(self) -> None:
        """Result file first (already written), then progress, then the terminal."""
        if self.uplink is None or self.payload is None:
            return
        self.uplink.flush(time.monotonic() + FLUSH_S)
        if not self.uplink.complete(json.loads(self.payload), time.monotonic() + PUSH_S):
            print("runner: the gateway never took the result; it stays in result.json",
                  file=sys.__stderr__)
        self.uplink.stop()

    def main(self) -> int:
        self.stdout = BoundedWriter(self.dir / STDOUT_FILE)
        sys.stdout = sys.stderr = self.stdout
        try:
            import playrun_client  # beside runner.py in the sandbox

            self.uplink = playrun_client.Uplink.from_env(self._stop)
        except ImportError:
            self.uplink = None
        if self.uplink is not None:
            self.uplink.start()
        try:
            ok = self.run()
        except BaseException as exc:  # noqa: BLE001 - the runner itself broke: still settle
            ok = self.fail(PLAY_ERROR, f"runner error: {self._describe(exc)}")
        self._done.set()
        self._flush_all()
        try:
            self._push()
        except Exception as exc:  # noqa: BLE001 - the result file is there to inspect
            print(f"runner: push failed: {exc}", file=sys.__stderr__)
        if self.ctx is not None:
            try:
                self.ctx.close()
            except OSError as exc:
                print(f"runner: cannot close {EVENTS_FILE}: {exc}", file=sys.__stderr__)
        return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run play.py from the current directory.")
    parser.add_argument("--timeout", type=float, required=True, help="wall clock, seconds")
    args = parser.parse_args(argv)
    code = Runner(Path.cwd(), args.timeout).main()
    # os._exit: threads the play left running must not keep the process (or the sandbox) up.
    os._exit(code)


if __name__ == "__main__":
    main()
