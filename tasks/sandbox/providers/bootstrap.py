"""What every remote adapter shares: the boot script, its commands and its status line.

A remote sandbox has no supervisor of ours, so the runner is started by a small
standard-library script (playrun_boot.py) that records its start and its end in files
under the workdir; any worker can read them later through the provider's API.
"""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Mapping, Sequence
from importlib import resources

from tasks.sandbox.base import ProcessStatus, ProviderError, SandboxSpec

WORKDIR = "/tmp/playrun"
BOOT_FILE = "playrun_boot.py"
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


def files_for(spec: SandboxSpec) -> dict[str, bytes]:
    """The spec's files and the boot script: everything a remote sandbox gets at create."""
    return {**spec.files, BOOT_FILE: boot_source()}


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


def launch_json(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> bytes:
    return json.dumps({"argv": expand(argv), "env": dict(env),
                       "timeout_s": max(timeout_s, 1.0)}).encode()


def env_json(env: Mapping[str, str]) -> bytes:
    return json.dumps(dict(env)).encode()


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
