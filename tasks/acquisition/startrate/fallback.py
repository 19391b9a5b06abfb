"""The degraded start-rate limiter: a per-process GCRA used while Redis is unavailable.

It paces at each rule's initial rate (or the operator override) with no AIMD: with
the fleet's shared state out of reach, the safe guess is the rate a fresh bucket
would start at. Every process paces on its own, so the fleet-wide rate is up to
(processes x initial); that is the price of never blocking a worker on Redis.
Penalties still hold this process for the cooldown, once per local epoch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from tasks.acquisition.startrate import maths
from tasks.acquisition.startrate.maths import MPM, Penalty, Permit, RateRule, RuleState


def wall_clock_us() -> int:
    # Wall time, not monotonic: permits carry epoch milliseconds like Redis TIME does.
    return time.time_ns() // 1000


class LocalStartRateLimiter:
    """Thread-safe, in-memory; the same maths as the Redis scripts with pinned rules."""

    def __init__(self, *, horizon_ms: int = 1000, clock_us: Callable[[], int] | None = None):
        self._horizon_us = max(0, horizon_ms) * 1000
        self._clock_us = clock_us or wall_clock_us
        self._lock = threading.Lock()
        self._states: dict[tuple[str, str], maths.State] = {}

    def _load(
        self, bucket: str, rules: Sequence[RateRule],
    ) -> tuple[list[tuple[str, str]], list[maths.Params], list[maths.State | None]]:
        keys = [(bucket, rule.name) for rule in rules]
        params = [maths.pinned(maths.params_of(rule)) for rule in rules]
        return keys, params, [self._states.get(key) for key in keys]

    def _store(self, keys: list[tuple[str, str]], states: list[maths.State | None]) -> None:
        for key, state in zip(keys, states, strict=True):
            if state is not None:
                self._states[key] = state

    def acquire(
        self, bucket: str, rules: Sequence[RateRule], observed_successes: int = 1,
    ) -> Permit:
        with self._lock:
            keys, params, states = self._load(bucket, rules)
            d, new = maths.acquire(
                params, states, self._clock_us(), self._horizon_us, observed_successes,
            )
            self._store(keys, new)
        return Permit(d.granted, d.scheduled_at_ms, d.server_now_ms, d.wait_ms,
                      d.rate_mpm / MPM, d.epoch, degraded=True)

    def penalize(
        self, bucket: str, rules: Sequence[RateRule], permit_epoch: int, cooldown_ms: int,
    ) -> Penalty:
        with self._lock:
            keys, params, states = self._load(bucket, rules)
            cut, new = maths.penalize(
                params, states, self._clock_us(), permit_epoch, cooldown_ms * 1000,
            )
            self._store(keys, new)
        return Penalty(cut.applied, cut.rate_mpm / MPM, cut.epoch, cut.cooldown_until_ms,
                       cut.server_now_ms, degraded=True)

    def inspect(self, bucket: str, rules: Sequence[RateRule]) -> list[RuleState]:
        with self._lock:
            _, params, states = self._load(bucket, rules)
            now = self._clock_us()
        out = []
        for rule, p, s in zip(rules, params, states, strict=True):
            cur = s if s is not None else maths.fresh(p)
            out.append(RuleState(
                name=rule.name, exists=s is not None,
                rate=maths.effective_mpm(p, cur) / MPM,
                adaptive_rate=maths.adaptive_mpm(p, cur) / MPM,
                epoch=cur.epoch, tat_us=cur.tat_us,
                cooldown_until_us=cur.cooldown_until_us, server_now_us=now, degraded=True,
            ))
        return out
