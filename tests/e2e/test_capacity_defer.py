"""`PLAYRUN_CAPACITY_FULL=defer`: a full org waits through the bounded deferral instead
of failing, and runs once a slot is free."""

from __future__ import annotations

import uuid

import pytest
import redis

import tasks
from tasks.acquisition import capacity
from tasks.acquisition.startrate import StartRateLimiter, rules_for
from tasks.settings import Settings, reset_settings
from tests.support.helpers import eventually
from tests.support.paths import PLAYS, ROOT
from tests.support.session import TEST_REDIS_URL
from tests.support.stack import Worker, worker_env

pytestmark = pytest.mark.slow


def test_a_full_org_defers_and_then_runs(pg_url: str, fifo: None) -> None:
    """In FIFO order a full org's start is published and deferred; the fair relay does not
    publish it until its org has room (tests/e2e/test_fair_starts.py)."""
    org = f"org-{uuid.uuid4().hex[:8]}"
    capacity.set_limit(org, 1)
    w = Worker(worker_env(PLAYRUN_CAPACITY_FULL="defer", PLAYRUN_DEFERRAL_BASE_MS="200",
                          PLAYRUN_DEFERRAL_MAX_MS="500", PLAYRUN_SWEEP_INTERVAL_S="0.5",
                          PLAYRUN_START_ORDER="fifo"),
               beat=True)
    try:
        w.wait_ready()
        long = tasks.submit_run(PLAYS / "sleepy.py", input={"seconds": 2}, org_id=org)
        eventually(lambda: tasks.get_run(long.id).sandbox_id, what="the first sandbox")
        second = tasks.submit_run(ROOT / "examples" / "plays" / "noop.py", input={}, org_id=org)
        assert long.wait(timeout=60).status == "succeeded"
        assert second.wait(timeout=60).status == "succeeded"
    finally:
        w.stop()
    causes = [e.data["cause"] for e in tasks.run_events(second.id) if e.kind == "run.deferred"]
    assert causes and set(causes) == {"capacity"}


def test_runs_waiting_for_capacity_take_no_start_permit(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Capacity is reserved before the start permit: a run deferred for its org's capacity
    leaves the provider's bucket as it was (no permit spent, no success counted). In FIFO
    order: the fair relay does not publish a full org's runs at all
    (tests/e2e/test_fair_starts.py)."""
    monkeypatch.setenv("PLAYRUN_START_ORDER", "fifo")
    reset_settings()
    org = f"org-{uuid.uuid4().hex[:8]}"
    capacity.set_limit(org, 1)
    env = {"PLAYRUN_CAPACITY_FULL": "defer", "PLAYRUN_DEFERRAL_BASE_MS": "200",
           "PLAYRUN_DEFERRAL_MAX_MS": "300", "PLAYRUN_SWEEP_INTERVAL_S": "0.5",
           "PLAYRUN_DEFERRAL_MAX_COUNT": "200",  # waits out the long run, however slow
           "PLAYRUN_START_RATE_INITIAL_PER_MIN": "60", "PLAYRUN_START_RATE_MAX_PER_MIN": "600",
           "PLAYRUN_START_RATE_INCREASE_PER_MIN": "60", "PLAYRUN_START_ORDER": "fifo"}
    settings = Settings(**{k.removeprefix("PLAYRUN_").lower(): v for k, v in env.items()})
    bucket = StartRateLimiter(redis.Redis.from_url(TEST_REDIS_URL))
    rules = rules_for(settings, "local", None)
    w = Worker(worker_env(**env), beat=True)
    try:
        w.wait_ready()
        long = tasks.submit_run(PLAYS / "sleepy.py", input={"seconds": 6}, org_id=org)
        eventually(lambda: tasks.get_run(long.id).sandbox_id, what="the first sandbox")
        before = bucket.inspect("local", rules)[0]
        second = tasks.submit_run(ROOT / "examples" / "plays" / "noop.py", input={}, org_id=org)
        eventually(lambda: tasks.get_run(second.id).deferral_count >= 3,
                   what="the second run to wait for capacity a few times")
        during = bucket.inspect("local", rules)[0]
        assert tasks.get_run(long.id).status == "running"
        assert second.wait(timeout=60).status == "succeeded"
    finally:
        w.stop()
        monkeypatch.undo()
        reset_settings()
    # tat_us is the bucket's next free slot: any permit granted would have moved it.
    assert (during.rate, during.adaptive_rate, during.epoch, during.tat_us) == \
        (before.rate, before.adaptive_rate, before.epoch, before.tat_us)
    causes = {e.data["cause"] for e in tasks.run_events(second.id) if e.kind == "run.deferred"}
    assert causes == {"capacity"}
