"""Launches this gateway process has seen lose their fence, refused from memory.

A launch that lost its fence never holds it again: the generation only grows, a terminal
run stays terminal, and an attempt that waits out a deferral drops its launch id. So once
an action of a token answered FENCE_LOST, every later request of that token is refused
the same way without reading its body, asking Redis or opening a transaction. A token
replayed after its run ended then costs a signature check and a dictionary read. The one
exception is the supervisor's exit-only token: `exited` after a terminal answers that
nothing is inspected, never FENCE_LOST.

Those refusals are also paced: a lost launch is answered at most once per PACE_S,
whatever connections it comes on, each later request held (a sleep, no CPU) for at most
WAIT_MAX_S. A client replaying a dead token as fast as it is answered would otherwise take
the event loop from every other run's requests; the runner that lost the fence heard
FENCE_LOST from the database first and has nothing left to send.

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
PACE_S = 0.25  # a lost launch's refusals: at most 4 a second
WAIT_MAX_S = 2.0  # past this a refusal is not held longer: the held ones are its connections


def _key(grant: Grant) -> Key:
    return grant.run_id, grant.generation, grant.launch_id


@dataclass
class _Lost:
    until: float  # its token's expiry
    next_at: float  # when its next refusal may be answered


@dataclass
class LostLaunches:
    limit: int = LIMIT
    pace_s: float = PACE_S
    wait_max_s: float = WAIT_MAX_S
    _lost: dict[Key, _Lost] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hold_s(self, grant: Grant, now: float | None = None) -> float | None:
        """None if this launch is not known to have lost its fence; else how long to hold
        its FENCE_LOST refusal before answering."""
        if RUN_EXIT in grant.capabilities:
            return None  # the supervisor's exit report after a terminal is news, not a refusal
        entry = self._lost.get(_key(grant))  # a dict read: atomic under the GIL
        if entry is None:
            return None
        now = time.time() if now is None else now  # a clock step moves a hold by WAIT_MAX_S at most
        with self._lock:
            slot = max(entry.next_at, now)
            entry.next_at = min(slot + self.pace_s, now + self.wait_max_s)
        return min(slot - now, self.wait_max_s)

    def lost(self, grant: Grant, now: float | None = None) -> None:
        """An action of this launch answered FENCE_LOST: remember it until its token expires."""
        now = time.time() if now is None else now
        with self._lock:
            if len(self._lost) >= self.limit:
                self._trim(now)
            self._lost[_key(grant)] = _Lost(grant.expires_at, now + self.pace_s)

    def __len__(self) -> int:
        return len(self._lost)

    def _trim(self, now: float) -> None:
        for key in [k for k, entry in self._lost.items() if entry.until <= now]:
            del self._lost[key]
        # Still full: the oldest go (insertion order), a tenth at a time.
        excess = len(self._lost) - self.limit + max(self.limit // 10, 1)
        for key in list(self._lost)[:max(excess, 0)]:
            del self._lost[key]


def refusal(grant: Grant) -> FenceLostError:
    return FenceLostError(f"launch {grant.launch_id} of run {grant.run_id} is not current")
