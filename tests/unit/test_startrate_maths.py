"""The pure start-rate maths and the in-memory fallback, on an injected clock (no Redis)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.acquisition.startrate import LocalStartRateLimiter, RateRule, maths, rules_for
from tasks.acquisition.startrate.maths import MPM, Params, State
from tasks.settings import Settings

T0 = 1_796_000_000_000_000  # a realistic Redis TIME in microseconds (above 2**50)
DEFAULTS = Settings()


def provider_params(**over: float) -> Params:
    rule = rules_for(DEFAULTS, "daytona", None)[0]
    fields = {**rule.__dict__, **over}
    return maths.params_of(RateRule(**fields))


class Sim:
    """One bucket driven through the pure maths with a hand-held clock."""

    def __init__(self, params: Sequence[Params], horizon_ms: int = 1000) -> None:
        self.params = list(params)
        self.states: list[State | None] = [None] * len(self.params)
        self.now = T0
        self.horizon_us = horizon_ms * 1000

    def acquire(self, successes: int = 1) -> maths.Decision:
        d, self.states = maths.acquire(self.params, self.states, self.now, self.horizon_us,
                                       successes)
        return d

    def penalize(self, epoch: int, cooldown_ms: int) -> maths.Cut:
        cut, self.states = maths.penalize(self.params, self.states, self.now, epoch,
                                          cooldown_ms * 1000)
        return cut


def test_units_and_validation() -> None:
    assert maths.interval_us(60 * MPM) == 1_000_000
    assert maths.interval_us(7 * MPM) == 8_571_429  # rounded up: never faster than the rate
    p = provider_params()
    assert (p.initial_mpm, p.max_mpm, p.floor_mpm, p.increase_mpm, p.decrease_ppm) == (
        60_000, 600_000, 6_000, 6_000, 500_000)
    with pytest.raises(ValueError):
        maths.params_of(RateRule("x", 10, 5, 1, 1, 0.5))  # initial above max
    with pytest.raises(ValueError):
        maths.params_of(RateRule("x", 10, 20, 1, 1, 1.5))  # factor above 1
    with pytest.raises(ValueError):
        maths.params_of(RateRule("x", 10, 20, 1, 1, 0.5, fixed_per_min=0))


def test_rules_for_defaults_override_and_global_cap() -> None:
    (rule,) = rules_for(DEFAULTS, "daytona", None)
    assert (rule.name, rule.initial_per_min, rule.max_per_min, rule.fixed_per_min) == (
        "provider", 60.0, 600.0, None)
    capped = rules_for(Settings(start_rate_global_max_per_min=300), "modal", 90)
    assert [r.name for r in capped] == ["provider", "global"]
    assert capped[0].fixed_per_min == 90 and capped[1].max_per_min == 300
    # Inconsistent settings still give a valid rule rather than crashing a worker.
    odd = rules_for(Settings(start_rate_floor_per_min=100, start_rate_max_per_min=10), "x", 0)
    maths.params_of(odd[0])
    assert odd[0].fixed_per_min == 1 / MPM


def saturating_ramp(params: Params, successes: int = 1) -> tuple[float, int]:
    """Always-waiting demand: seconds (scheduled time) from the first increase to max."""
    sim = Sim([params])
    first_raise = None
    grants = 0
    while True:
        d = sim.acquire(successes)
        if not d.granted:
            sim.now = (d.server_now_ms + d.wait_ms) * 1000
            continue
        grants += 1
        if first_raise is None and d.rate_mpm > params.initial_mpm:
            first_raise = d.scheduled_at_ms
        if d.rate_mpm == params.max_mpm:
            assert first_raise is not None
            return (d.scheduled_at_ms - first_raise) / 1000, grants


@pytest.mark.parametrize("successes", [1, 3])
def test_ramp_from_initial_to_max_matches_the_formula(successes: int) -> None:
    p = provider_params()
    took, grants = saturating_ramp(p, successes)
    formula = maths.ramp_seconds(60, 600, 6 * successes)
    assert abs(took - formula) <= 0.10 * formula, (took, formula)
    assert grants == 1 + -(-(600 - 60) // (6 * successes))


def test_idle_bucket_does_not_grow() -> None:
    p = provider_params()
    sim = Sim([p])
    for _ in range(50):
        d = sim.acquire(successes=5)
        assert d.granted and d.rate_mpm == p.initial_mpm
        sim.now += maths.interval_us(p.initial_mpm) * 5 // 2  # demand under half the rate


def test_exact_pace_counts_as_busy_and_grows() -> None:
    p = provider_params()
    sim = Sim([p], horizon_ms=0)
    rates = []
    for _ in range(4):
        d = sim.acquire()
        assert d.granted
        rates.append(d.rate_mpm)
        assert sim.states[0] is not None
        sim.now = sim.states[0].tat_us  # the next caller arrives exactly on its slot
    assert rates == [60_000, 66_000, 72_000, 78_000]


def test_a_start_deferred_to_its_slot_grows_the_rate_though_it_arrives_late() -> None:
    p = provider_params()
    sim = Sim([p], horizon_ms=0)
    rates = []
    for _ in range(4):
        d = sim.acquire()
        assert d.granted
        rates.append(d.rate_mpm)
        assert sim.states[0] is not None
        # Told to come back at its slot, it arrives through the broker a little after it.
        sim.now = sim.states[0].tat_us + maths.interval_us(d.rate_mpm) * 4 // 5
    assert rates == [60_000, 66_000, 72_000, 78_000]


def test_grants_are_paced_and_never_burst() -> None:
    p = provider_params(initial_per_min=600, max_per_min=600)
    sim = Sim([p])
    scheduled = []
    for _ in range(30):  # thirty callers at the same instant
        d = sim.acquire()
        if d.granted:
            scheduled.append(d.scheduled_at_ms)
    # Only the horizon (1 s) fills: 100 ms apart, eleven slots from now to now + 1 s.
    assert len(scheduled) == 11
    assert all(b - a == 100 for a, b in itertools.pairwise(scheduled))


def test_denial_reserves_nothing_and_wait_is_exact_to_the_ms() -> None:
    p = provider_params(initial_per_min=7, max_per_min=7, floor_per_min=7)  # odd interval
    sim = Sim([p], horizon_ms=250)
    sim.now = T0 + 123_457
    assert sim.acquire().granted
    before = list(sim.states)
    d = sim.acquire()
    assert not d.granted and sim.states == before
    sim.now = (d.server_now_ms + d.wait_ms - 1) * 1000  # the ms before: still too early
    assert not sim.acquire().granted
    sim.now = (d.server_now_ms + d.wait_ms) * 1000
    assert sim.acquire().granted


def test_cut_once_per_epoch_floor_and_cooldown() -> None:
    p = provider_params(initial_per_min=600)
    sim = Sim([p])
    epoch = sim.acquire().epoch
    cut = sim.penalize(epoch, cooldown_ms=15_000)
    assert cut.applied and cut.rate_mpm == 300_000 and cut.epoch == epoch + 1
    stale = sim.penalize(epoch, cooldown_ms=15_000)
    assert not stale.applied and stale.rate_mpm == 300_000 and stale.epoch == epoch + 1
    start = sim.now
    for offset_ms in (0, 1, 7_500, 14_999):
        sim.now = start + offset_ms * 1000
        d = sim.acquire()
        assert not d.granted and d.server_now_ms + d.wait_ms == cut.cooldown_until_ms
    sim.now = cut.cooldown_until_ms * 1000
    assert sim.acquire().granted
    for _ in range(20):
        sim.penalize(sim.acquire().epoch, cooldown_ms=0)
    assert sim.states[0] is not None and sim.states[0].rate_mpm == p.floor_mpm


def test_penalty_newer_than_state_after_key_loss_counts_once() -> None:
    sim = Sim([provider_params()])
    assert sim.penalize(7, cooldown_ms=0).epoch == 8  # keys were lost at 7
    assert not sim.penalize(7, cooldown_ms=0).applied


def test_override_replaces_rate_and_keeps_adaptive_state() -> None:
    p = provider_params()
    fixed = Params(**{**p.__dict__, "fixed_mpm": 120_000})
    sim = Sim([p])
    for _ in range(5):
        sim.acquire()
    adaptive = sim.states[0].rate_mpm if sim.states[0] else 0
    assert adaptive > p.initial_mpm
    sim.params = [fixed]
    for _ in range(10):
        d = sim.acquire()
        assert d.rate_mpm == 120_000 or not d.granted
    assert sim.states[0] is not None and sim.states[0].rate_mpm == adaptive
    sim.params = [p]
    assert sim.acquire().rate_mpm == adaptive


def test_all_rules_must_grant_and_only_then_commit() -> None:
    provider = provider_params(initial_per_min=600, max_per_min=600)
    cap = maths.params_of(RateRule("global", 60, 60, 60, 0, 1))
    sim = Sim([provider, cap], horizon_ms=0)
    assert sim.acquire().granted
    before = list(sim.states)
    d = sim.acquire()
    assert not d.granted and d.wait_ms == 1000 and sim.states == before
    assert d.rate_mpm == 60_000  # the binding (slowest) rule


ops = st.lists(
    st.tuples(st.integers(-5_000, 2_000_000), st.sampled_from(["acquire", "penalize"]),
              st.integers(0, 4), st.booleans()),
    min_size=1, max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, horizon_ms=st.sampled_from([0, 250, 1000]))
def test_rate_stays_within_floor_and_max_and_grants_stay_paced(
    ops: list[tuple[int, str, int, bool]], horizon_ms: int,
) -> None:
    p = provider_params(initial_per_min=120, max_per_min=240, floor_per_min=30,
                        increase_per_min=20, decrease_factor=0.7)
    sim = Sim([p], horizon_ms)
    last: tuple[int, int] | None = None  # (scheduled_us, interval_us) of the last grant
    for dt, op, n, stale in ops:
        sim.now += dt
        if op == "acquire":
            before = sim.states[0] or maths.fresh(p)
            d = sim.acquire(n)
            if d.granted:
                sched = max(sim.now, before.tat_us)
                if last is not None:
                    assert sched - last[0] >= last[1]  # one permit per 60_000 / rate ms
                last = (sched, maths.interval_us(maths.effective_mpm(p, before)))
                assert sched - sim.now <= horizon_ms * 1000
        else:
            epoch = (sim.states[0] or maths.fresh(p)).epoch
            sim.penalize(epoch - 1 if stale else epoch, cooldown_ms=n * 100)
        s = sim.states[0]
        if s is not None:
            assert p.floor_mpm <= s.rate_mpm <= p.max_mpm


def test_local_fallback_paces_at_initial_rate_without_growth() -> None:
    now = [T0]
    local = LocalStartRateLimiter(horizon_ms=0, clock_us=lambda: now[0])
    (rule,) = rules_for(DEFAULTS, "daytona", None)
    got = []
    for _ in range(200):
        permit = local.acquire("daytona", [rule])
        assert permit.degraded and permit.rate == 60.0
        if permit.granted:
            got.append(permit.scheduled_at_ms)
        else:
            now[0] = (permit.server_now_ms + permit.wait_ms) * 1000
    assert all(b - a == 1000 for a, b in itertools.pairwise(got))
    assert local.acquire("daytona", [rules_for(DEFAULTS, "x", 600)[0]]).rate == 600.0
    penalty = local.penalize("daytona", [rule], 0, cooldown_ms=5_000)
    assert penalty.applied and penalty.rate == 60.0  # pinned: no cut, but a cooldown
    assert not local.acquire("daytona", [rule]).granted
    assert local.inspect("daytona", [rule])[0].epoch == 1


def test_a_providers_published_create_limit_bounds_the_default_rule() -> None:
    (rule,) = rules_for(Settings(), "e2b", None, published_per_min=60)
    assert (rule.initial_per_min, rule.max_per_min) == (60, 60)
    # An operator on a bigger plan says so, and that wins over the published default.
    (rule,) = rules_for(Settings(start_rate_max_per_min=300), "e2b", None, published_per_min=60)
    assert rule.max_per_min == 300
    (rule,) = rules_for(Settings(), "daytona", None, published_per_min=None)
    assert rule.max_per_min == Settings().start_rate_max_per_min
