"""The play runner: `python runner.py --timeout SECONDS` inside a sandbox directory.

Standard library only; copied into each sandbox as runner.py. It loads play.py, calls
`run(ctx, input)` and always tries to leave exactly one terminal result in result.json:
    {"status": "succeeded", "output": ...} or {"status": "failed", "code": ..., "error": ...}
Exit code 0 whenever a result was written, whatever the outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the host imports the runner's files as tasks.execution.*
    from tasks import protocol
    from tasks.execution.runner_context import BoundedWriter, Context, encode_json
else:  # in the sandbox they are flat files beside runner.py
    import playrun_protocol as protocol
    from playrun_context import BoundedWriter, Context, encode_json

__all__ = ["BoundedWriter", "Context", "Runner", "main"]

TRACEBACK_FRAMES = 12
# If the play swallows the timeout (or ignores SIGALRM) the watchdog thread settles the run
# this long after the deadline; the supervisor's hard kill is the last resort.
WATCHDOG_GRACE_S = 2.0
# After the result file: progress gets this long to drain, the terminal push this long.
FLUSH_S = 15.0
PUSH_S = 60.0
STOPPED_EXIT = 3


class RunTimeout(BaseException):
    """Raised inside the play at the deadline; BaseException so `except Exception` misses it."""


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
            path = self.dir / protocol.RESULT_FILE
            tmp = self.dir / f".{protocol.RESULT_FILE}.tmp"
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
                print(f"runner: cannot write {protocol.RESULT_FILE}: {exc}", file=sys.__stderr__)
                return False
            return True

    def fail(self, code: str, error: str) -> bool:
        if len(error) > protocol.MAX_ERROR_CHARS:
            error = error[: protocol.MAX_ERROR_CHARS - 20] + "\n...[truncated]"
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
        self.fail(protocol.RUN_TIMEOUT, self._timeout_message())
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
                print(f"runner: cannot flush {protocol.STDOUT_FILE}: {exc}", file=sys.__stderr__)

    # --- phases -------------------------------------------------------------------------

    def _load(self) -> types.CodeType | str:
        try:
            source = (self.dir / protocol.PLAY_FILE).read_bytes().decode("utf-8")
        except FileNotFoundError:
            return f"{protocol.PLAY_FILE} not found"
        except UnicodeDecodeError as exc:
            return f"{protocol.PLAY_FILE} is not UTF-8: {exc}"
        except OSError as exc:
            return f"cannot read {protocol.PLAY_FILE}: {exc}"
        try:
            # dont_inherit: the runner's __future__ flags must not change the play's semantics.
            return compile(source, protocol.PLAY_FILE, "exec", dont_inherit=True)
        except SyntaxError as exc:
            return f"SyntaxError at line {exc.lineno}: {exc.msg}"
        except ValueError as exc:  # e.g. null bytes in the source
            return f"{protocol.PLAY_FILE} cannot be compiled: {exc}"

    def _read_input(self) -> tuple[Any, str | None]:
        try:
            return json.loads((self.dir / protocol.INPUT_FILE).read_bytes()), None
        except FileNotFoundError:
            return None, f"{protocol.INPUT_FILE} not found"
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            return None, f"{protocol.INPUT_FILE} is not valid JSON: {exc}"

    def _describe(self, exc: BaseException) -> str:
        try:
            head = f"{type(exc).__name__}: {exc}"
        except Exception:  # noqa: BLE001 - the play's __str__ may raise anything
            head = f"{type(exc).__name__}: <unprintable>"
        head = head[: protocol.MAX_ERROR_CHARS // 2]
        # The runner's own frames (this file and the context's) say nothing about the play.
        ours = {
            os.path.abspath(__file__),
            os.path.abspath(sys.modules[Context.__module__].__file__ or ""),
        }
        frames = [
            f
            for f in traceback.extract_tb(exc.__traceback__)
            if os.path.abspath(f.filename) not in ours
        ]
        tail = "".join(traceback.format_list(frames[-TRACEBACK_FRAMES:]))
        room = protocol.MAX_ERROR_CHARS - len(head) - 40
        if len(tail) > room:
            tail = "..." + tail[-room:]
        return f"{head}\nTraceback (most recent call last):\n{tail}".rstrip()

    def run(self) -> bool:
        code = self._load()
        if isinstance(code, str):
            return self.fail(protocol.PLAY_INVALID, code)
        value, problem = self._read_input()
        if problem is not None:
            return self.fail(protocol.INPUT_INVALID, problem)

        self.ctx = Context(self.dir, self.uplink)
        self.ctx._deadline = time.monotonic() + self.timeout_s
        module = types.ModuleType("play")
        module.__file__ = str(self.dir / protocol.PLAY_FILE)
        sys.modules["play"] = module
        sys.argv = [protocol.PLAY_FILE]
        try:
            try:
                self._arm()
                exec(code, module.__dict__)
                entry = getattr(module, "run", None)
                if not callable(entry):
                    self._disarm()
                    return self.fail(
                        protocol.PLAY_INVALID, f"{protocol.PLAY_FILE} defines no callable run()"
                    )
                output = entry(self.ctx, value)
            finally:
                self._disarm()
                # What is left (serialising, writing) is bounded; the watchdog may stand down.
                self._done.set()
        except RunTimeout:
            return self.fail(protocol.RUN_TIMEOUT, self._timeout_message())
        except BaseException as exc:  # noqa: BLE001 - SystemExit etc. are play failures too
            if self._timed_out:
                return self.fail(protocol.RUN_TIMEOUT, self._timeout_message())
            if self.ctx.halted is not None:
                return self.fail(*self.ctx.halted)
            why = self.ctx.failure_code(exc)
            return self.fail(why or protocol.PLAY_ERROR, self._describe(exc))
        if self._timed_out:  # the play caught RunTimeout and returned anyway
            return self.fail(protocol.RUN_TIMEOUT, self._timeout_message())
        if self.ctx.halted:  # a sheet stopped the run and the play carried on regardless
            return self.fail(*self.ctx.halted)
        try:
            text = json.dumps(output, allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError) as exc:
            return self.fail(protocol.OUTPUT_INVALID, f"output is not JSON-serialisable: {exc}")
        data = encode_json(text)
        if len(data) > protocol.MAX_OUTPUT_BYTES:
            return self.fail(
                protocol.OUTPUT_INVALID,
                f"output is {len(data)} bytes; the limit is {protocol.MAX_OUTPUT_BYTES}",
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
            print(
                "runner: the gateway never took the result; it stays in result.json",
                file=sys.__stderr__,
            )
        self.uplink.stop()

    def main(self) -> int:
        self.stdout = BoundedWriter(self.dir / protocol.STDOUT_FILE)
        sys.stdout = sys.stderr = self.stdout
        try:
            if TYPE_CHECKING or __package__:
                from tasks.execution import runner_client as client
            else:
                import playrun_client as client
        except ImportError:  # started by hand without it: the result file is the channel
            self.uplink = None
        else:
            self.uplink = client.Uplink.from_env(self._stop)
        if self.uplink is not None:
            self.uplink.start()
        try:
            ok = self.run()
        except BaseException as exc:  # noqa: BLE001 - the runner itself broke: still settle
            ok = self.fail(protocol.PLAY_ERROR, f"runner error: {self._describe(exc)}")
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
                print(f"runner: cannot close {protocol.EVENTS_FILE}: {exc}", file=sys.__stderr__)
        return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run play.py from the current directory.")
    parser.add_argument("--timeout", type=float, required=True, help="wall clock, seconds")
    parser.add_argument("--standby", action="store_true",
                        help="a warm sandbox: wait (up to --timeout) for a run to be assigned")
    args = parser.parse_args(argv)
    timeout = args.timeout
    if args.standby:
        if TYPE_CHECKING or __package__:
            from tasks.execution import runner_standby as standby
        else:
            import playrun_standby as standby
        assignment = standby.await_assignment(timeout)
        if assignment is None:
            os._exit(0)  # retired or its life over: nothing ran
        timeout = standby.take(assignment, Path.cwd())
    code = Runner(Path.cwd(), timeout).main()
    # os._exit: threads the play left running must not keep the process (or the sandbox) up.
    os._exit(code)


if __name__ == "__main__":
    main()
