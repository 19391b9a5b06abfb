"""A provider's 429 holds the fleet's start rate under the rate it refused, and its
Retry-After shortens the cooldown."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tasks.acquisition import ceiling, permits
from tasks.acquisition.policy import NORMAL, Policy
from tasks.acquisition.startrate import rules_for
from tasks.settings import Settings, get_settings, reset_settings

OPEN = Policy(NORMAL)


@pytest.fixture
def settings(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    for name, value in {"INITIAL": "600", "MAX": "6000", "FLOOR": "60",
                        "INCREASE": "60"}.items():
        monkeypatch.setenv(f"PLAYRUN_START_RATE_{name}_PER_MIN", value)
    monkeypatch.setenv("PLAYRUN_START_RATE_COOLDOWN_MS", "15000")
    reset_settings()
    yield get_settings()
    monkeypatch.undo()
    reset_settings()


def state(provider: str, settings: Settings) -> tuple[float, int]:
    """(the rate a worker paces at, cooldown left in ms)."""
    found = permits.limiter().inspect(provider, permits._rules(provider, OPEN, settings, None))[0]
    return found.rate, max(0, (found.cooldown_until_us - found.server_now_us) // 1000)


def test_a_rate_limited_create_caps_the_rate_for_every_worker(settings: Settings) -> None:
    provider = f"p-{uuid.uuid4().hex[:8]}"
    granted = [permits.acquire(provider, OPEN, settings) for _ in range(80)]
    assert all(g.granted for g in granted)
    # The bucket allowed 600/min, but the fleet made 80 starts in the last minute when the
    # provider refused: the ceiling is a little under what was made, not what was allowed.
    assert permits.penalize(provider, OPEN, granted[-1].epoch, settings, refused_rate=600.0,
                            retry_after_s=0)
    held = ceiling.current(settings.redis_url, provider)
    assert held is not None and 60.0 <= held <= 72.0
    rate, _ = state(provider, settings)
    assert rate <= held
    # Another process (no cached value) reads the same ceiling from Redis.
    ceiling._cache.clear()
    assert ceiling.current(settings.redis_url, provider) == held
    # Growth stops at the ceiling, not at the configured max.
    for _ in range(40):
        permits.accepted(provider)
    assert permits.acquire(provider, OPEN, settings).granted
    assert permits.acquire(provider, OPEN, settings).granted
    assert state(provider, settings)[0] == held
    assert rules_for(settings, provider, None)[0].max_per_min == 6000.0  # settings untouched


def test_a_refusal_after_few_starts_holds_the_fleet_at_the_floor(settings: Settings) -> None:
    provider = f"p-{uuid.uuid4().hex[:8]}"
    granted = permits.acquire(provider, OPEN, settings)
    assert permits.penalize(provider, OPEN, granted.epoch, settings, refused_rate=600.0)
    assert ceiling.current(settings.redis_url, provider) == 60.0  # PLAYRUN_START_RATE_FLOOR


def test_retry_after_shortens_the_cooldown_but_never_lengthens_it(settings: Settings) -> None:
    short, long = f"p-{uuid.uuid4().hex[:8]}", f"p-{uuid.uuid4().hex[:8]}"
    for provider, hint in ((short, 2.0), (long, 120.0)):
        epoch = permits.acquire(provider, OPEN, settings).epoch
        assert permits.penalize(provider, OPEN, epoch, settings, retry_after_s=hint)
    assert 0 < state(short, settings)[1] <= 2000
    assert 14000 < state(long, settings)[1] <= 15000  # the configured cooldown is the most
    assert ceiling.current(settings.redis_url, short) is None  # no refused rate: no ceiling


def test_a_refusal_at_a_lower_rate_does_not_ratchet_the_ceiling_down(
        settings: Settings) -> None:
    provider = f"p-{uuid.uuid4().hex[:8]}"
    assert ceiling.learn(settings.redis_url, provider, 1000.0, 60.0) == 900.0
    # A burst inside the provider's window is refused at half the rate: the cut handles
    # it, and the fleet still climbs back to just under the limit it found first.
    assert ceiling.learn(settings.redis_url, provider, 500.0, 60.0) == 900.0
    ceiling._cache.clear()
    assert ceiling.current(settings.redis_url, provider) == 900.0
