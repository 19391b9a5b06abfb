"""Pure start-rate maths: GCRA pacing whose rate adapts AIMD-style (docs/design.md).

No Redis and no clock here: every function takes ``now_us``. The Lua scripts in
``lua/`` do the same integer arithmetic step for step, and a differential test
feeds both the same arrivals and compares the decisions exactly. So:

- rates are integers in milli-starts per minute ("mpm"): Lua numbers are doubles
  and Redis truncates them in replies, so no fractional rate ever crosses a wire;
- times are integer microseconds (Redis ``TIME``); every value stays below 2**53,
  where a double holds integers exactly and ``floor(a / b)`` equals integer division;
- the decrease factor is an integer in parts per million.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

MPM = 1000  # milli-starts per minute per start per minute
PPM = 1_000_000  # the decrease factor's fixed-point unit
_US_PER_MIN_MPM = 60_000_000 * MPM  # interval_us = ceil(this / rate_mpm)
MAX_RATE_PER_MIN = 1_000_000.0  # keeps rate * PPM below 2**53 in Lua


# -- public value types ----------------------------------------------------------------


@dataclass(frozen=True)
class RateRule:
    """One pacing rule of a bucket; a permit needs every rule of the bucket to grant."""

    name: str  # "provider" or "global"
    initial_per_min: float
    max_per_min: float
    floor_per_min: float
    increase_per_min: float
    decrease_factor: float
    fixed_per_min: float | None = None  # operator override: replaces the adaptive rate


@dataclass(frozen=True)
class Permit:
    """One acquire decision. ``granted`` permits start at ``scheduled_at_ms`` (server ms).

    ``wait_ms`` (denials only) is how long after ``server_now_ms`` an acquire succeeds if
    nobody else takes the slot first. ``rate`` is the slowest rule's rate after the
    decision (starts per minute); ``epoch`` goes back to ``penalize``.
    """

    granted: bool
    scheduled_at_ms: int
    server_now_ms: int
    wait_ms: int
    rate: float
    epoch: int
    degraded: bool = False


@dataclass(frozen=True)
class Penalty:
    """What ``penalize`` did: ``applied`` is False for a stale epoch (already counted)."""

    applied: bool
    rate: float
    epoch: int
    cooldown_until_ms: int
    server_now_ms: int
    degraded: bool = False


@dataclass(frozen=True)
class RuleState:
    """One rule's stored state as ``inspect`` reads it (no side effects)."""

    name: str
    exists: bool
    rate: float  # effective: the override if passed, else the adaptive rate
    adaptive_rate: float
    epoch: int
    tat_us: int  # GCRA theoretical arrival time: the next free slot
    cooldown_until_us: int
    server_now_us: int
    degraded: bool = False


# -- integer form ----------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """A RateRule in the integer units the Lua scripts take (ARGV order)."""

    initial_mpm: int
    max_mpm: int
    floor_mpm: int
    increase_mpm: int
    decrease_ppm: int
    fixed_mpm: int = 0  # 0: no override

    def argv(self) -> tuple[int, int, int, int, int, int]:
        return (self.initial_mpm, self.max_mpm, self.floor_mpm,
                self.increase_mpm, self.decrease_ppm, self.fixed_mpm)


@dataclass(frozen=True)
class State:
    """One rule's stored hash: adaptive rate, GCRA TAT, penalty epoch, cooldown end."""

    rate_mpm: int
    tat_us: int
    epoch: int
    cooldown_until_us: int


@dataclass(frozen=True)
class Decision:
    """An acquire decision in the units the Lua script replies with."""

    granted: bool
    scheduled_at_ms: int
    server_now_ms: int
    wait_ms: int
    rate_mpm: int
    epoch: int


@dataclass(frozen=True)
class Cut:
    """A penalize outcome in the units the Lua script replies with."""

    applied: bool
    rate_mpm: int
    epoch: int
    cooldown_until_ms: int
    server_now_ms: int


def to_mpm(per_min: float) -> int:
    return max(1, round(per_min * MPM))


def params_of(rule: RateRule) -> Params:
    """Validate a rule and convert it; a bad rule is a programming error, so raise."""
    for value in (rule.initial_per_min, rule.max_per_min, rule.floor_per_min):
        if not 0 < value <= MAX_RATE_PER_MIN:
            raise ValueError(f"rule {rule.name!r}: rates must be in (0, {MAX_RATE_PER_MIN}]")
    if not rule.floor_per_min <= rule.initial_per_min <= rule.max_per_min:
        raise ValueError(f"rule {rule.name!r}: need floor <= initial <= max")
    if rule.increase_per_min < 0 or not 0 < rule.decrease_factor <= 1:
        raise ValueError(f"rule {rule.name!r}: need increase >= 0 and 0 < factor <= 1")
    fixed = rule.fixed_per_min
    if fixed is not None and not 0 < fixed <= MAX_RATE_PER_MIN:
        raise ValueError(f"rule {rule.name!r}: fixed rate must be in (0, {MAX_RATE_PER_MIN}]")
    return Params(
        initial_mpm=to_mpm(rule.initial_per_min),
        max_mpm=to_mpm(rule.max_per_min),
        floor_mpm=to_mpm(rule.floor_per_min),
        increase_mpm=round(rule.increase_per_min * MPM),
        decrease_ppm=max(1, round(rule.decrease_factor * PPM)),
        fixed_mpm=0 if fixed is None else to_mpm(fixed),
    )


def pinned(p: Params) -> Params:
    """The degraded-mode rule: the override or the initial rate, no AIMD at all."""
    rate = p.fixed_mpm or p.initial_mpm
    return Params(rate, rate, rate, 0, PPM, 0)


# -- the maths -------------------------------------------------------------------------


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def ms_ceil(us: int) -> int:
    return ceil_div(us, 1000)


def ms_floor(us: int) -> int:
    return us // 1000


def interval_us(rate_mpm: int) -> int:
    """Microseconds per permit, rounded up so pacing never exceeds the rate."""
    return ceil_div(_US_PER_MIN_MPM, rate_mpm)


def fresh(p: Params) -> State:
    """A missing (new or expired) key: the initial rate, no backlog, epoch 0."""
    return State(p.initial_mpm, 0, 0, 0)


def adaptive_mpm(p: Params, s: State) -> int:
    # Clamped on read so a changed floor/max applies at once to stored state.
    return min(p.max_mpm, max(p.floor_mpm, s.rate_mpm))


def effective_mpm(p: Params, s: State) -> int:
    return p.fixed_mpm if p.fixed_mpm > 0 else adaptive_mpm(p, s)


def is_busy(s: State, now_us: int, interval: int) -> bool:
    """A backlog, or the next slot (tat) came at most an interval ago: a start deferred to
    its slot arrives after it (the broker, the deferral's jitter), and is demand all the
    same. Demand under half the rate never grows it."""
    return s.tat_us + interval >= now_us


def grown_mpm(p: Params, s: State, busy: bool, successes: int) -> int:
    """Additive increase after a grant: only while busy and only without an override."""
    rate = adaptive_mpm(p, s)
    if p.fixed_mpm > 0 or not busy or successes <= 0:
        return rate
    return min(p.max_mpm, rate + p.increase_mpm * successes)


def cut_mpm(p: Params, s: State) -> int:
    """Multiplicative decrease, never below the floor."""
    return max(p.floor_mpm, adaptive_mpm(p, s) * p.decrease_ppm // PPM)


def acquire(
    params: Sequence[Params],
    states: Sequence[State | None],
    now_us: int,
    horizon_us: int,
    successes: int,
) -> tuple[Decision, list[State | None]]:
    """Check every rule first; commit every rule only if all grant (None = missing key).

    A grant is scheduled at the latest rule's next slot, at most ``horizon_us`` ahead.
    A denial reserves nothing and says how long until an acquire would succeed.
    """
    cur = [s if s is not None else fresh(p) for p, s in zip(params, states, strict=True)]
    scheduled = max(max(now_us, s.tat_us) for s in cur)
    cooldown = max(s.cooldown_until_us for s in cur)
    need_us = max(cooldown - now_us, scheduled - now_us - horizon_us)
    now_ms = ms_floor(now_us)
    epoch = max(s.epoch for s in cur)
    if need_us > 0:
        # Relative to the reported ms so "wait until server_now_ms + wait_ms" suffices.
        wait_ms = ms_ceil(now_us + need_us) - now_ms
        rate = min(effective_mpm(p, s) for p, s in zip(params, cur, strict=False))
        earliest = ms_ceil(max(scheduled, cooldown))
        return Decision(False, earliest, now_ms, wait_ms, rate, epoch), list(states)
    new: list[State | None] = []
    for p, s in zip(params, cur, strict=False):
        # Every rule's next slot follows the shared schedule, so each rule stays paced.
        tat = scheduled + interval_us(effective_mpm(p, s))
        rate = grown_mpm(p, s, is_busy(s, now_us, interval_us(effective_mpm(p, s))),
                         successes)
        new.append(State(rate, tat, s.epoch, s.cooldown_until_us))
    rate = min(effective_mpm(p, s) for p, s in zip(params, new, strict=False) if s is not None)
    return Decision(True, ms_ceil(scheduled), now_ms, 0, rate, epoch), new


def penalize(
    params: Sequence[Params],
    states: Sequence[State | None],
    now_us: int,
    permit_epoch: int,
    cooldown_us: int,
) -> tuple[Cut, list[State | None]]:
    """Cut every rule once per epoch and hold grants for the cooldown.

    A penalty carrying an epoch older than the bucket's was already counted: N workers
    that saw the same pushback under one epoch cut the rate once.
    """
    cur = [s if s is not None else fresh(p) for p, s in zip(params, states, strict=True)]
    epoch = max(s.epoch for s in cur)
    now_ms = ms_floor(now_us)
    if permit_epoch < epoch:
        rate = min(effective_mpm(p, s) for p, s in zip(params, cur, strict=False))
        until = ms_ceil(max(s.cooldown_until_us for s in cur))
        return Cut(False, rate, epoch, until, now_ms), list(states)
    # max(): a permit from before a key was lost still moves the epoch past itself.
    new_epoch = max(epoch, permit_epoch) + 1
    until_us = now_us + max(0, cooldown_us)
    new: list[State | None] = [
        replace(s, rate_mpm=cut_mpm(p, s), epoch=new_epoch,
                cooldown_until_us=max(s.cooldown_until_us, until_us))
        for p, s in zip(params, cur, strict=False)
    ]
    rate = min(effective_mpm(p, s) for p, s in zip(params, new, strict=False) if s is not None)
    until = ms_ceil(max(s.cooldown_until_us for s in new if s is not None))
    return Cut(True, rate, new_epoch, until, now_ms), new


def ramp_seconds(initial_per_min: float, max_per_min: float, increase_per_min: float) -> float:
    """Time from initial to max under saturating demand (continuous approximation).

    Each grant adds ``increase`` and grants come at ``rate / 60`` per second, so
    ``dr/dt = increase * r / 60`` and ``t = 60 / increase * ln(max / initial)``.
    """
    return 60.0 / increase_per_min * math.log(max_per_min / initial_per_min)
