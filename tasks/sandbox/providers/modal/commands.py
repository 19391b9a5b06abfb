"""The shell commands a Modal sandbox runs for playrun, and how their output is read.

The runner is the sandbox's entrypoint (an exec'd process cannot be re-attached from
another worker), so the entrypoint waits for the launch file, runs the boot script's
`run`, then lingers so the exit record and result file stay readable for a while.
"""

from __future__ import annotations

import shlex

from tasks.sandbox.base import FileRead, ProcessStatus, ProviderError
from tasks.sandbox.providers import bootstrap

# How often the entrypoint looks for the launch file before the runner is started.
LAUNCH_POLL_S = 0.1

_ENTRY = (
    'launch="$1"; linger="$2"; shift 2; '
    f'until [ -e "$launch" ]; do sleep {LAUNCH_POLL_S:g}; done; '
    '"$@"; rc=$?; sleep "$linger"; exit "$rc"'
)

# Prints the file's size on one line then at most max bytes from offset; "absent"
# when it is not a regular file (a FIFO or /dev/zero would never end).
_READ = (
    'f="$1"; if [ -f "$f" ]; then wc -c < "$f"; '
    'tail -c +"$(($2 + 1))" "$f" | head -c "$3"; else echo absent; fi'
)


def entrypoint(workdir: str, *, timeout_s: float, linger_s: float) -> list[str]:
    launch = f"{workdir}/{bootstrap.LAUNCH_FILE}"
    return [
        "sh",
        "-c",
        _ENTRY,
        "sh",
        launch,
        f"{max(linger_s, 0.0):g}",
        *bootstrap.run_argv(workdir, timeout_s=timeout_s),
    ]


def status_argv(workdir: str) -> list[str]:
    """One status line; a launch file not yet taken means the runner is about to start."""
    launch = shlex.quote(f"{workdir}/{bootstrap.LAUNCH_FILE}")
    running = shlex.quote('{"state": "running"}')
    return [
        "sh",
        "-c",
        f"if [ -f {launch} ]; then echo {running}; else {bootstrap.status_command(workdir)}; fi",
    ]


def safe_relative(path: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or not parts or ".." in parts:
        raise ProviderError(f"a sandbox path must be relative to its workdir: {path!r}")
    return "/".join(parts)


def read_argv(workdir: str, path: str, offset: int, max_bytes: int) -> list[str]:
    if offset < 0 or max_bytes < 0:
        raise ProviderError("offset and max_bytes must not be negative")
    return [
        "sh",
        "-c",
        _READ,
        "sh",
        f"{workdir}/{safe_relative(path)}",
        str(offset),
        str(max_bytes),
    ]


def parse_read(out: bytes, offset: int, max_bytes: int) -> FileRead | None:
    """The read command's output, untrusted: a size line, then no more than asked for."""
    head, sep, data = out.partition(b"\n")
    if head.strip() == b"absent" and not data:
        return None
    if not sep or not head.strip().isdigit() or len(head) > 20:
        raise ProviderError(f"the sandbox's file read answer is garbled: {out[:80]!r}")
    size = int(head)
    if len(data) > max_bytes:
        raise ProviderError(f"the sandbox sent {len(data)} bytes for a read of {max_bytes}")
    return FileRead(data=data, size=size, truncated=offset + len(data) < size)


def parse_status(out: bytes) -> ProcessStatus:
    return bootstrap.parse_status(out)
