"""The deferral maths (docs/design.md): exponential, capped, equal jitter, a known wait as floor."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.acquisition.backoff import budget_exhausted, deferral_delay_ms, pacing_delay_ms


@pytest.mark.parametrize(("count", "low", "high"), [
    (0, 50, 100), (1, 100, 200), (2, 200, 400), (3, 400, 800), (10, 5000, 10000),
    (31, 5000, 10000), (10**6, 5000, 10000),  # huge counts stay at the cap, no overflow
])
def test_the_delay_doubles_until_the_cap_with_half_of_it_random(count: int, low: int,
                                                                 high: int) -> None:
    def delay(r: float) -> int:
        return deferral_delay_ms(count, base_ms=100, max_ms=10000, rand=lambda: r)

    assert (delay(0.0), delay(1.0)) == (low, high)
    assert low <= delay(0.5) <= high


def test_a_known_wait_is_a_floor_never_a_ceiling() -> None:
    assert deferral_delay_ms(0, base_ms=100, max_ms=1000, at_least_ms=5000,
                             rand=lambda: 0.0) == 5000
    assert deferral_delay_ms(3, base_ms=100, max_ms=1000, at_least_ms=10,
                             rand=lambda: 0.0) == 400


def test_jitter_spreads_a_fleet_deferred_together() -> None:
    import random

    rng = random.Random(7)
    delays = {deferral_delay_ms(4, base_ms=100, max_ms=60000, rand=rng.random)
              for _ in range(200)}
    assert len(delays) > 150 and min(delays) >= 800 and max(delays) <= 1600


@given(st.integers(0, 10**9), st.integers(1, 10**6), st.integers(1, 10**7),
       st.floats(0, 1), st.integers(0, 10**7))
def test_the_delay_is_bounded(count: int, base: int, cap: int, r: float, floor: int) -> None:
    d = deferral_delay_ms(count, base_ms=base, max_ms=cap, at_least_ms=floor, rand=lambda: r)
    assert max(floor, min(cap, base * 2 ** min(count, 30)) // 2) <= d
    assert d <= max(floor, min(cap, base * 2 ** min(count, 30)))


@pytest.mark.parametrize(("count", "total", "nxt", "exhausted"), [
    (0, 0, 100, False), (19, 0, 100, False), (20, 0, 100, True),  # count budget
    (5, 1700, 100, False), (5, 1700, 101, True), (5, 1801, 0, True),  # time budget
])
def test_the_budget(count: int, total: int, nxt: int, exhausted: bool) -> None:
    assert budget_exhausted(count, total, nxt, max_count=20, max_total_ms=1800) is exhausted


@given(wait=st.integers(1, 10**7), r=st.floats(0, 1, exclude_max=True))
def test_a_throttled_start_comes_back_when_its_permit_is_due(wait: int, r: float) -> None:
    delay = pacing_delay_ms(wait, rand=lambda: r)
    assert wait <= delay <= wait + min(wait / 4, 1000)
