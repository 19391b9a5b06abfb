"""Starts and watches the runner inside a remote sandbox (standard library only).

    python3 playrun_boot.py start --timeout S [--env-file F] -- ARGV...
    python3 playrun_boot.py run --timeout S      # entrypoint form: waits for the launch file
    python3 playrun_boot.py status               # one JSON line: running/exited/missing/...

The keeper process writes .playrun/started.json, runs ARGV in its own process group,
kills the group at the timeout and writes .playrun/exited.json: a worker on another
machine reads these through the provider's file or exec API to judge a quiet runner.
Given an exit report (REPORT_KEY in the env file or the launch file: a token that can only
report this launch's exit, and the gateway's URL), the keeper then POSTs `exited` to the
gateway with playrun_report.py, uploaded beside it; the runner's environment never has it.
"""

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATE = ".playrun"
STARTED = os.path.join(STATE, "started.json")
EXITED = os.path.join(STATE, "exited.json")
LAUNCH = os.path.join(STATE, "launch.json")
LOG = os.path.join(STATE, "runner.log")
KILL_GRACE_S = 5.0
MARK = "playrun_boot"
# The exit report's config, taken out of the env file or launch file before the runner's
# environment is built (not a variable name, so no env var can collide with it).
REPORT_KEY = "playrun.exit_report"
REPORT_MODULE = "playrun_report"  # tasks/sandbox/supervisor_report.py, uploaded at create


def _write(path: str, doc: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _env_from(path: str) -> tuple[dict[str, str], dict[str, Any] | None]:
    """The runner's environment and the exit report's config, from the env file."""
    doc = _read(path) or {}
    with contextlib.suppress(OSError):
        os.unlink(path)  # holds tokens: the play must not find them on disk
    report = _take_report(doc)
    return {str(k): str(v) for k, v in doc.items()}, report


def _take_report(doc: dict[str, Any]) -> dict[str, Any] | None:
    report = doc.pop(REPORT_KEY, None)
    return report if isinstance(report, dict) else None


Reporter = Callable[[int], None]


def _reporter(report: dict[str, Any] | None) -> Reporter | None:
    """What sends the exit report, imported now: once the play runs it may rewrite the
    workdir. None without a report, or without its module (the heartbeat timeout remains)."""
    if report is None:
        return None
    sys.dont_write_bytecode = True  # no __pycache__ in the play's workdir
    try:
        module = importlib.import_module(REPORT_MODULE)
    except (ImportError, SyntaxError) as exc:
        print(f"playrun_boot: no exit report ({exc})", file=sys.stderr, flush=True)
        return None
    workdir = Path.cwd()

    def send(code: int) -> None:
        try:
            module.report_exit(report, code, module.has_result(workdir))
        except Exception as exc:  # noqa: BLE001 - the exit is on record; heartbeats remain
            print(f"playrun_boot: the exit report failed: {exc!r:.200}", file=sys.stderr,
                  flush=True)

    return send


def keep(argv: list[str], env: dict[str, str], timeout_s: float,
         report: Reporter | None = None) -> int:
    """Run argv to its end or the timeout; record both ends, then report the exit.
    Returns the exit code."""
    os.makedirs(STATE, exist_ok=True)
    with open(LOG, "ab") as log:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    _write(STARTED, {"keeper": os.getpid(), "pid": proc.pid, "at": time.time()})
    timed_out = False
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid, signal.SIGKILL)
            code = proc.wait()
    _write(EXITED, {"exit_code": code, "timed_out": timed_out, "at": time.time()})
    if report is not None:  # after the record: the inspection it starts finds the exit
        report(code)
    return code


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, sig)


def start(timeout_s: float, env_file: str | None, argv: list[str]) -> int:
    env = dict(os.environ)
    report = None
    if env_file:
        from_file, report = _env_from(env_file)
        env.update(from_file)
    os.makedirs(STATE, exist_ok=True)
    for stale in (STARTED, EXITED):
        if os.path.exists(stale):
            return 3  # a runner was started here already: never a second one
    reporter = _reporter(report)
    if os.fork() == 0:
        os.setsid()  # outlives the exec call that started it
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            # The keeper's own complaints (an undelivered report) go to the runner's log.
            with contextlib.suppress(OSError):
                log = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
                os.dup2(log, 2)
                os.close(log)
            try:
                keep(argv, env, timeout_s, reporter)
            finally:
                os._exit(0)
        os._exit(0)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:  # return once the start is on record
        if os.path.exists(STARTED):
            return 0
        time.sleep(0.005)
    return 4


def run(timeout_s: float) -> int:
    while True:
        doc = _read(LAUNCH)
        if doc is not None:
            break
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        os.unlink(LAUNCH)  # holds tokens: the play must not find them on disk
    reporter = _reporter(_take_report(doc))
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (doc.get("env") or {}).items()})
    argv = [str(a) for a in doc.get("argv") or []]
    return keep(argv, env, float(doc.get("timeout_s") or timeout_s), reporter)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return MARK.encode() in fh.read()
    except OSError:
        return True  # no /proc: the signal check stands


def status() -> dict[str, Any]:
    exited = _read(EXITED)
    if exited is not None:
        return {"state": "exited", "exit_code": exited.get("exit_code"),
                "timed_out": bool(exited.get("timed_out"))}
    started = _read(STARTED)
    if started is None:
        return {"state": "never_started"}
    keeper = started.get("keeper")
    if isinstance(keeper, int) and _alive(keeper):
        return {"state": "running"}
    return {"state": "missing"}


def main(args: list[str]) -> int:
    if args and args[0] == "--workdir":
        os.chdir(args[1])
        args = args[2:]
    verb, rest = (args[0], args[1:]) if args else ("", [])
    timeout_s, env_file = 3600.0, None
    while rest and rest[0] != "--":
        flag = rest.pop(0)
        if flag == "--timeout":
            timeout_s = float(rest.pop(0))
        elif flag == "--env-file":
            env_file = rest.pop(0)
    argv = rest[1:]
    if verb == "start" and argv:
        return start(timeout_s, env_file, argv)
    if verb == "run":
        return run(timeout_s)
    if verb == "status":
        print(json.dumps(status()), flush=True)
        return 0
    print("usage: playrun_boot.py start|run|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
