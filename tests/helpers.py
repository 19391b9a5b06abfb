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
