"""Per-minute start-rate samples: written after each acquire and penalty, read for the chart."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from tasks.acquisition import permits, starthistory
from tasks.acquisition.policy import NORMAL, Policy
from tasks.acquisition.startrate import Permit
from tasks.constants import START_HISTORY_TTL_S
from tasks.dashboard.chart import render
from tasks.settings import get_settings, reset_settings


@pytest.fixture
def slow_bucket(redis_client: redis.Redis[bytes]) -> Iterator[str]:
    """A bucket of its own at 6 starts/min: one grant, then denials (10 s apart)."""
    yield f"hist-{uuid.uuid4().hex[:8]}"


def test_acquires_and_penalties_are_counted_per_minute(slow_bucket: str,
                                                       redis_client: redis.Redis[bytes]) -> None:
    settings = get_settings().model_copy(update={"start_rate_initial_per_min": 6.0,
                                                 "start_rate_floor_per_min": 1.0})
    policy = Policy(NORMAL)
    starthistory.flush()
    starthistory.reset()  # as after a quiet second: the next decision is written at once
    writes = starthistory.writer().writes
    decisions = [permits.acquire(slow_bucket, policy, settings)]
    assert sum(s.grants for s in starthistory.read_history()[slow_bucket]) == 1
    decisions += [permits.acquire(slow_bucket, policy, settings) for _ in range(3)]
    assert [d.granted for d in decisions] == [True, False, False, False]
    assert permits.penalize(slow_bucket, policy, decisions[0].epoch, settings)
    assert not permits.penalize(slow_bucket, policy, decisions[0].epoch, settings)  # same epoch
    # The burst right after that write waits in memory for one write together.
    assert sum(s.denials for s in starthistory.read_history()[slow_bucket]) < 3 \
        or starthistory.writer().writes - writes > 1
    starthistory.flush()
    assert starthistory.writer().writes - writes <= 2  # five decisions, two round trips

    history = starthistory.read_history()
    samples = history[slow_bucket]
    assert len(samples) == 60
    assert [s.minute for s in samples] == sorted(s.minute for s in samples)
    assert (samples[-1].minute - samples[0].minute).total_seconds() == 59 * 60
    assert sum(s.grants for s in samples) == 1
    assert sum(s.denials for s in samples) == 3
    assert sum(s.penalties for s in samples) == 1  # only the applied one
    rates = [s.rate for s in samples if s.rate is not None]
    assert rates and rates[-1] < decisions[-1].rate  # the cut rate the penalty reported
    keys = list(redis_client.scan_iter(match=f"playrun:starthist:{{{slow_bucket}}}:*"))
    assert keys and all(0 < redis_client.ttl(k) <= START_HISTORY_TTL_S for k in keys)

    svg = str(render(slow_bucket, samples))
    assert svg.startswith("<svg") and svg.count('class="grants"') == 1
    assert svg.count('class="denials"') >= 1 and 'class="penalty"' in svg
    assert 'data-count="3"' in svg or svg.count('class="denials"') > 1


def test_a_dead_redis_costs_a_start_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAYRUN_REDIS_URL", "redis://127.0.0.1:1/0")
    reset_settings()
    try:
        began = time.monotonic()
        starthistory.record_permit("dead", Permit(True, 0, int(time.time() * 1000), 0, 60.0, 1))
        starthistory.flush()
        assert time.monotonic() - began < 1.0
        decision = permits.acquire("dead", Policy(NORMAL), get_settings())
        assert decision.degraded and decision.granted
    finally:
        monkeypatch.undo()
        reset_settings()


def test_a_bucket_name_is_escaped_in_the_chart() -> None:
    svg = str(render('<script>alert("x")</script>', []))
    assert "<script>" not in svg and "&lt;script&gt;" in svg
