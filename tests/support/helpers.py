"""Small polling helpers for end-to-end tests (deadlines, never fixed sleeps)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T | None], timeout: float = 30.0, every: float = 0.05,
               what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def kinds(run_id: str) -> list[str]:
    import tasks

    return [e.kind for e in tasks.run_events(run_id)]


def pids_with_env(name: str, value: str) -> list[int]:
    """Live processes whose environment has name=value: Celery's pool children and the
    bundled server carry their parent's environment, not its command line."""
    import os
    from pathlib import Path

    needle = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found
