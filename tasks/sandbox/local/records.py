"""The control record of a local sandbox: `<root>/.control/<sandbox_id>/`, outside the
sandbox's directory, holding what a worker needs to poll or delete it (meta, PROC and EXIT
records, the supervisor's copy, the console log), read defensively."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from tasks import protocol
from tasks.sandbox import supervisor as sup
from tasks.sandbox import supervisor_limits, supervisor_proc, supervisor_report, supervisor_strict
from tasks.sandbox.base import ProcessStatus

CONTROL_ROOT = ".control"  # <root>/.control/<sandbox_id>/: never inside a sandbox
META_FILE = "meta.json"
PROC_FILE = "proc.json"
SUPERVISOR_FILE = "supervisor.py"
# Copied into each control record at create, flat: the supervisor runs from there and
# imports its siblings by these names.
SUPERVISOR_FILES = {
    Path(str(module.__file__)).name: Path(str(module.__file__)).read_bytes()
    for module in (sup, supervisor_limits, supervisor_proc, supervisor_report, supervisor_strict)
} | {protocol.PROTOCOL_FILE: Path(str(protocol.__file__)).read_bytes()}
# Files of the control record that read_file shows under ".playrun/" (the token never is).
VISIBLE_CONTROL_FILES = frozenset({supervisor_proc.CONSOLE_FILE})
# Half-created or half-deleted directories left by a crash are swept after this long.
STALE_TMP_S = 600.0


def read_json(path: Path) -> dict[str, Any] | None:
    """A record's JSON object, or None when it is missing, unreadable or not an object."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def exit_status(control: Path) -> ProcessStatus | None:
    """What the supervisor's exit record says, or None before it wrote one."""
    record = read_json(control / supervisor_proc.EXIT_FILE)
    if record is None:
        return None
    if record.get("never_started") is True:
        # The supervisor got no exec config (its worker died first): nothing ran.
        return ProcessStatus("never_started")
    code = record.get("exit_code")
    limit = record.get("limit")
    return ProcessStatus(
        "exited",
        code if isinstance(code, int) else None,
        bool(record.get("timed_out")),
        limit=str(limit) if limit else None,
    )


def top_alive(control: Path) -> bool:
    """The recorded top process is alive and really is this sandbox's (not a reused pid)."""
    record = read_json(control / PROC_FILE)
    if record is None or not isinstance(record.get("pid"), int):
        return False
    pid = record["pid"]
    stat_ = supervisor_proc.read_stat(pid)
    if stat_ is None or stat_[0] in ("Z", "X") or stat_[3] != record.get("starttime"):
        return False
    return str(control / SUPERVISOR_FILE) in supervisor_proc.read_cmdline(pid)


def remove_tree(path: Path) -> None:
    """rmtree that also removes entries a play made unwritable (chmod 000 directories)."""

    def fix(_func: Any, target: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(target), 0o700)
            if os.path.isdir(target) and not os.path.islink(target):
                os.chmod(target, 0o700)
                shutil.rmtree(target, ignore_errors=True)
            else:
                os.unlink(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix)


def sweep_leftover(entry: os.DirEntry[str], now: float) -> None:
    """Remove what a killed create, probe or delete left under a temporary name. A delete
    killed the processes before its rename, so its leftovers have nothing to wait for."""
    try:
        if entry.name.startswith(".deleting-") or \
                now - entry.stat(follow_symlinks=False).st_mtime > STALE_TMP_S:
            remove_tree(Path(entry.path))
    except OSError:
        pass
