"""The adaptive rate grows on creates the provider accepted, not on permits handed out."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tasks.acquisition import permits
from tasks.acquisition.policy import NORMAL, Policy
from tasks.acquisition.startrate import rules_for
from tasks.settings import Settings, get_settings, reset_settings

OPEN = Policy(NORMAL)


@pytest.fixture
def settings(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    # 600/min: a permit every 100 ms, so back-to-back acquires find the bucket busy.
    for name, value in {"INITIAL": "600", "MAX": "6000", "FLOOR": "60",
                        "INCREASE": "60"}.items():
        monkeypatch.setenv(f"PLAYRUN_START_RATE_{name}_PER_MIN", value)
    reset_settings()
    yield get_settings()
    monkeypatch.undo()
    reset_settings()


def rate(provider: str, settings: Settings) -> float:
    rules = rules_for(settings, provider, None)
    return permits.limiter().inspect(provider, rules)[0].adaptive_rate


def test_permits_alone_leave_the_rate_unchanged(settings: Settings) -> None:
    provider = f"p-{uuid.uuid4().hex[:8]}"
    for _ in range(4):  # as for runs that then wait for capacity: no create happened
        assert permits.acquire(provider, OPEN, settings).granted
    assert rate(provider, settings) == 600.0


def test_accepted_creates_grow_the_rate_with_the_next_permit(settings: Settings) -> None:
    provider = f"p-{uuid.uuid4().hex[:8]}"
    assert permits.acquire(provider, OPEN, settings).granted
    permits.accepted(provider)
    permits.accepted(provider)
    assert rate(provider, settings) == 600.0  # reported with the next acquire, not before
    assert permits.acquire(provider, OPEN, settings).granted  # busy: 100 ms apart
    assert rate(provider, settings) == 600.0 + 2 * 60.0
    assert permits.acquire(provider, OPEN, settings).granted
    assert rate(provider, settings) == 720.0  # each success counted once


def test_a_denied_permit_keeps_the_successes_for_later(settings: Settings,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    provider = f"p-{uuid.uuid4().hex[:8]}"
    assert permits.acquire(provider, OPEN, settings).granted
    permits.accepted(provider)
    far = settings.model_copy(update={"start_local_sleep_ms": 0})
    with monkeypatch.context() as m:
        m.setattr(permits, "get_settings", lambda: far)  # horizon 0: the next is denied
        assert not permits.acquire(provider, OPEN, far).granted
    assert permits.acquire(provider, OPEN, settings).granted
    assert rate(provider, settings) == 660.0


def test_only_a_reserved_slot_ahead_is_slept_for(settings: Settings,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle bucket grants at once (its reply reads up to 1 ms ahead by rounding alone);
    the next permit, 100 ms later in the schedule, is waited for in place."""
    provider = f"p-{uuid.uuid4().hex[:8]}"
    slept: list[float] = []
    monkeypatch.setattr(permits.time, "sleep", slept.append)
    assert permits.acquire(provider, OPEN, settings).granted
    assert slept == []
    assert permits.acquire(provider, OPEN, settings).granted  # 600/min: 100 ms behind
    assert len(slept) == 1 and 0.05 < slept[0] <= 0.102  # whole ms, rounded up
