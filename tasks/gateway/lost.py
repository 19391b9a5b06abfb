"""Launches this gateway process has seen lose their fence, refused from memory.

A launch that lost its fence never holds it again: the generation only grows, a terminal
run stays terminal, and an attempt that waits out a deferral drops its launch id. So once
an action of a token answered FENCE_LOST, every later request of that token is refused
the same way without reading its body, asking Redis or opening a transaction. A token
replayed after its run ended then costs a signature check and a dictionary read. The one
exception is the supervisor's exit-only token: `exited` after a terminal answers that
nothing is inspected, never FENCE_LOST.

The map is bounded: past `limit`, entries whose token has expired go first (the
signature check refuses those tokens anyway), then the oldest; a forgotten launch only
costs its next request the database check again.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from tasks.errors import FenceLostError
from tasks.security.tokens import RUN_EXIT, Grant

Key = tuple[str, int, str]  # (run id, generation, launch id)
LIMIT = 65_536


def _key(grant: Grant) -> Key:
    return grant.run_id, grant.generation, grant.launch_id


@dataclass
class LostLaunches:
    limit: int = LIMIT
    _until: dict[Key, float] = field(default_factory=dict)  # key -> its token's expiry
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, grant: Grant) -> None:
        """Raise FenceLostError if this launch is known to have lost its fence."""
        if RUN_EXIT in grant.capabilities:
            return  # the supervisor's exit report after a terminal is news, not a refusal
        if _key(grant) in self._until:  # a dict read: atomic under the GIL
            raise FenceLostError(f"launch {grant.launch_id} of run {grant.run_id} "
                                 "is not current")

    def lost(self, grant: Grant, now: float | None = None) -> None:
        """An action of this launch answered FENCE_LOST: remember it until its token expires."""
        now = time.time() if now is None else now
        with self._lock:
            if len(self._until) >= self.limit:
                self._trim(now)
            self._until[_key(grant)] = grant.expires_at

    def __len__(self) -> int:
        return len(self._until)

    def _trim(self, now: float) -> None:
        for key in [k for k, until in self._until.items() if until <= now]:
            del self._until[key]
        # Still full: the oldest go (insertion order), a tenth at a time.
        excess = len(self._until) - self.limit + max(self.limit // 10, 1)
        for key in list(self._until)[:max(excess, 0)]:
            del self._until[key]
