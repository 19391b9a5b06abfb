"""What the gateway remembers of each attempt's refused requests: how many of each code are
not yet in the ledger, and how close the attempt is to its hard budget.

A refusal costs no database write of its own. The first refusal of a code is written at
once as a `gateway.refused` row (`code`, `count`); later ones are gathered into at most
one row per code every GATEWAY_REFUSED_EVERY_S (and before the attempt's terminal), at
most GATEWAY_REFUSED_MAX_EVENTS rows per attempt, then one `ledger.budget_spent` row,
and past that they are only counted.

The hard budget is a leaky count: each refusal adds one, it drains
`gateway_abuse_refusals` per `gateway_abuse_window_s`; past the budget the attempt is
failed GATEWAY_ABUSE (once) and every later request of it is refused at once.

The rows are per gateway process, in memory; the ledger's own budget
(ledger.append_budgeted) bounds them across processes. The hard budget is fleet-wide when
`shared` is given (fleet/limits.py: one count in Redis for every gateway process and
host, so the attempt fails once); without it, or while Redis does not answer, each
process keeps its own count.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from tasks.constants import (
    GATEWAY_REFUSED_EVERY_S,
    GATEWAY_REFUSED_GROUP,
    GATEWAY_REFUSED_MAX_EVENTS,
    EventKind,
)
from tasks.errors import FenceLostError, GatewayAbuseError
from tasks.security.tokens import Grant
from tasks.store import ledger
from tasks.store.db import session_scope
from tasks.store.fence import LaunchFence, hold_launch

Key = tuple[str, int]  # (run id, generation), as budgets.py keys an attempt
# Attempts not refused for this long are forgotten (their count has drained by then).
IDLE_S = 120.0
SWEEP_EVERY = 1024
ABUSE_MESSAGE = "this attempt was failed for sustained refused requests"


@dataclass(frozen=True)
class Flush:
    """Rows to write for one attempt: refusals by code, one row each."""

    counts: dict[str, int]
    last: bool  # these rows spend the attempt's rows: say so with `ledger.budget_spent`


@dataclass(frozen=True)
class Verdict:
    flush: Flush | None
    # This refusal crossed the hard budget: fail the attempt (told to one caller only).
    tripped: bool = False
    totals: dict[str, int] = field(default_factory=dict)  # refusals by code, when tripped
    failed: bool = False  # the attempt is failed (by this refusal or before it)


@dataclass(frozen=True)
class Count:
    """The fleet-wide hard budget's answer for one refusal (fleet/limits.py)."""

    tripped: bool = False  # this refusal crossed it: fail the attempt
    failed: bool = False  # the attempt was failed before: this refusal is not counted
    totals: dict[str, int] = field(default_factory=dict)  # refusals by code, when tripped


class SharedCount(Protocol):
    async def count(self, key: Key, code: str, keep_s: float) -> Count | None:
        """The fleet's count, or None to count in this process (Redis did not answer)."""
        ...


@dataclass
class _Tally:
    at: float
    level: float = 0.0
    flushed_at: float = -math.inf
    rows: int = 0
    pending: Counter[str] = field(default_factory=Counter)
    total: Counter[str] = field(default_factory=Counter)
    written: set[str] = field(default_factory=set)
    closed: bool = False  # no more rows: the rows are spent or the fence is gone
    failed_until: float | None = None  # failed: refused at once until its token expires


@dataclass
class Refusals:
    limit: int
    window_s: float
    max_rows: int = GATEWAY_REFUSED_MAX_EVENTS
    every_s: float = GATEWAY_REFUSED_EVERY_S
    shared: SharedCount | None = None  # the fleet-wide hard budget, if any
    _tallies: dict[Key, _Tally] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _noted: int = 0

    def check(self, key: Key) -> None:
        """Raise GatewayAbuseError if this process knows the attempt failed (the fleet's
        admit answers it for the others: fleet/limits.py)."""
        tally = self._tallies.get(key)  # a dict read: atomic under the GIL
        if tally is not None and tally.failed_until is not None:
            raise GatewayAbuseError(ABUSE_MESSAGE)

    def failed(self, key: Key, keep_s: float = IDLE_S, now: float | None = None) -> None:
        """The attempt was failed (the fleet says so): check() refuses it from now on."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tally = self._tallies.setdefault(key, _Tally(at=now))
            if tally.failed_until is None:
                tally.failed_until = now + max(keep_s, IDLE_S)

    async def refuse(self, key: Key, code: str, keep_s: float = IDLE_S) -> Verdict:
        """note() with the fleet's count when there is one."""
        count = None if self.shared is None else await self.shared.count(key, code, keep_s)
        return self.note(key, code, keep_s=keep_s, count=count)

    def note(self, key: Key, code: str, now: float | None = None,
             keep_s: float = IDLE_S, count: Count | None = None) -> Verdict:
        """Count one refusal; say which rows to write and whether it failed the attempt.
        keep_s: how long a failed attempt's token stays valid (it is refused until then).
        count: the fleet's hard budget decided (else this process's own count does)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._noted += 1
            if self._noted % SWEEP_EVERY == 0:
                self._sweep(now)
            tally = self._tallies.get(key)
            if tally is None:
                tally = self._tallies[key] = _Tally(at=now)
            if tally.failed_until is None and count is not None and count.failed:
                tally.failed_until = now + max(keep_s, IDLE_S)
            if tally.failed_until is not None:
                return Verdict(None, failed=True)
            if count is None:
                drained = max(now - tally.at, 0.0) * self.limit / self.window_s
                tally.level = max(tally.level - drained, 0.0) + 1
            tally.at = now
            tally.pending[code] += 1
            tally.total[code] += 1
            if count.tripped if count is not None else tally.level > self.limit:
                tally.failed_until = now + max(keep_s, IDLE_S)
                totals = count.totals if count is not None else dict(tally.total)
                return Verdict(self._take(tally, now), True, totals, failed=True)
            if now - tally.flushed_at >= self.every_s:
                return Verdict(self._take(tally, now))
            # A code's first refusal is a row of its own at once; the rest wait their turn.
            return Verdict(self._take(tally, now, only=code) if code not in tally.written
                           else None)

    def settling(self, key: Key, now: float | None = None) -> Flush | None:
        """What is left to write before the attempt's terminal (after it, no fence holds)."""
        with self._lock:
            tally = self._tallies.get(key)
            if tally is None:
                return None
            flush = self._take(tally, time.monotonic() if now is None else now)
            tally.closed = True
            return flush

    def close(self, key: Key) -> None:
        """The attempt's fence is gone: write nothing more for it."""
        with self._lock:
            tally = self._tallies.get(key)
            if tally is not None:
                tally.closed = True

    def _take(self, tally: _Tally, now: float, only: str | None = None) -> Flush | None:
        """Pending refusals as rows (all codes, or `only` one), within the attempt's rows."""
        room = self.max_rows - tally.rows
        if tally.closed or room <= 0 or not tally.pending:
            return None
        if only is None:
            tally.flushed_at = now
        # Codes without a row first: every code shows in the ledger while rows are left.
        codes = [only] if only is not None else sorted(
            tally.pending, key=lambda c: (c in tally.written, c))[:room]
        counts = {code: tally.pending.pop(code) for code in codes}
        tally.rows += len(counts)
        tally.written.update(counts)
        tally.closed = tally.rows >= self.max_rows
        return Flush(counts, tally.closed)

    def _sweep(self, now: float) -> None:
        for key in [k for k, t in self._tallies.items()
                    if (now > t.failed_until if t.failed_until is not None
                        else now - t.at > IDLE_S)]:
            del self._tallies[key]


def record(grant: Grant, flush: Flush) -> bool:
    """Write the rows in one fenced transaction; False if the attempt is no longer current."""
    fence = LaunchFence(grant.run_id, grant.generation, grant.launch_id)
    try:
        # Not durable: a lost row is a lost diagnostic; the metric has every refusal.
        with session_scope(durable=False) as session:
            hold_launch(session, fence)
            for code, count in flush.counts.items():
                ledger.append_budgeted(
                    session, grant.run_id, grant.generation, EventKind.GATEWAY_REFUSED,
                    {"code": code, "count": count}, group=GATEWAY_REFUSED_GROUP,
                    kinds=[EventKind.GATEWAY_REFUSED], budget=GATEWAY_REFUSED_MAX_EVENTS)
            if flush.last:
                ledger.spent(session, grant.run_id, grant.generation,
                             group=GATEWAY_REFUSED_GROUP, budget=GATEWAY_REFUSED_MAX_EVENTS)
    except FenceLostError:
        return False
    return True
