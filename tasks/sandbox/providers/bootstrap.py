"""What every remote adapter shares: the boot script, its commands and its status line.

A remote sandbox has no supervisor of ours, so the runner is started by a small
standard-library script (playrun_boot.py) that records its start and its end in files
under the workdir; any worker can read them later through the provider's API. With an
ExitReport it also tells the gateway of the runner's exit at once, through the local
supervisor's own report module (supervisor_report.py, uploaded as playrun_report.py with
the protocol beside it).
"""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from tasks import protocol
from tasks.sandbox.base import ExitReport, ProcessStatus, ProviderError, SandboxSpec

WORKDIR = "/tmp/playrun"
BOOT_FILE = "playrun_boot.py"
# The exit report's sender in the sandbox (playrun_boot.REPORT_MODULE imports it).
REPORT_FILE = "playrun_report.py"
# Where the exit report's config rides in the env file or the launch file: the boot script
# takes it out before it builds the runner's environment (playrun_boot.REPORT_KEY).
REPORT_KEY = "playrun.exit_report"
STATE_DIR = ".playrun"
STARTED_FILE = f"{STATE_DIR}/started.json"
EXITED_FILE = f"{STATE_DIR}/exited.json"
LAUNCH_FILE = f"{STATE_DIR}/launch.json"
ENV_FILE = f"{STATE_DIR}/env.json"
LOG_FILE = f"{STATE_DIR}/runner.log"
PYTHON = "python3"
# A status line is a few dozen bytes; anything longer did not come from the boot script.
MAX_STATUS_BYTES = 4096
_STATES = ("running", "exited", "missing", "never_started")


@functools.cache
def boot_source() -> bytes:
    return resources.files("tasks.sandbox.providers").joinpath(BOOT_FILE).read_bytes()


@functools.cache
def boot_files() -> dict[str, bytes]:
    """The boot script and what it imports to report the exit, by their names in the sandbox."""
    return {
        BOOT_FILE: boot_source(),
        REPORT_FILE: resources.files("tasks.sandbox").joinpath("supervisor_report.py")
        .read_bytes(),
        protocol.PROTOCOL_FILE: resources.files("tasks").joinpath("protocol.py").read_bytes(),
    }


def files_for(spec: SandboxSpec) -> dict[str, bytes]:
    """The spec's files and the boot script's: everything a remote sandbox gets at create."""
    return {**spec.files, **boot_files()}


def expand(argv: Sequence[str]) -> list[str]:
    return [PYTHON if arg == "{python}" else arg for arg in argv]


def _timeout(timeout_s: float) -> str:
    return f"{max(timeout_s, 1.0):g}"


def start_command(workdir: str, argv: Sequence[str], *, timeout_s: float,
                  env_file: str | None = None) -> str:
    """A shell command that returns once the runner is started, detached, in workdir."""
    parts = [PYTHON, BOOT_FILE, "start", "--timeout", _timeout(timeout_s)]
    if env_file:
        parts += ["--env-file", env_file]
    parts += ["--", *expand(argv)]
    return f"cd {shlex.quote(workdir)} && " + shlex.join(parts)


def run_argv(workdir: str, *, timeout_s: float) -> list[str]:
    """The entrypoint form: waits for LAUNCH_FILE, then runs what it names."""
    return [PYTHON, f"{workdir}/{BOOT_FILE}", "--workdir", workdir, "run",
            "--timeout", _timeout(timeout_s)]


def _report(report: ExitReport | None) -> dict[str, Any]:
    """The exit report's config for the boot script: the token and the gateway's URL (a
    remote sandbox never has the gateway's Unix socket)."""
    if report is None:
        return {}
    return {REPORT_KEY: {"token": report.token, "url": report.url}}


def launch_json(argv: Sequence[str], env: Mapping[str, str], timeout_s: float,
                report: ExitReport | None = None) -> bytes:
    return json.dumps({"argv": expand(argv), "env": dict(env),
                       "timeout_s": max(timeout_s, 1.0), **_report(report)}).encode()


def env_json(env: Mapping[str, str], report: ExitReport | None = None) -> bytes:
    return json.dumps({**env, **_report(report)}).encode()


def status_command(workdir: str) -> str:
    """Prints one JSON line; a workdir that is not there means nothing was started."""
    quoted = shlex.quote(workdir)
    never = shlex.quote(json.dumps({"state": "never_started"}))
    return (f"if [ -f {quoted}/{BOOT_FILE} ]; then cd {quoted} && {PYTHON} {BOOT_FILE} status;"
            f" else echo {never}; fi")


def parse_status(stdout: bytes | str) -> ProcessStatus:
    """The boot script's status line, read as untrusted: bounded, typed, or an error."""
    raw = stdout.encode() if isinstance(stdout, str) else stdout
    if len(raw) > MAX_STATUS_BYTES:
        raise ProviderError(f"the sandbox's status answer is {len(raw)} bytes")
    lines = [line for line in raw.decode("utf-8", "replace").splitlines() if line.strip()]
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("state") not in _STATES:
        raise ProviderError(f"the sandbox's status answer is not a status: {raw[:200]!r}")
    code = doc.get("exit_code")
    return ProcessStatus(state=doc["state"],
                         exit_code=code if isinstance(code, int) and
                         not isinstance(code, bool) else None,
                         timed_out=doc.get("timed_out") is True)
