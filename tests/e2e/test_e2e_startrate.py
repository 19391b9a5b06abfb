"""Start-rate control end to end: traffic policy, bounded deferral, provider pushback,
with real workers, real Redis and the scriptable `fake` provider."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
import redis
import sqlalchemy as sa

import tasks
from models import Outbox
from tasks.acquisition import policy
from tasks.acquisition.startrate import StartRateLimiter, rules_for
from tasks.sandbox import FakeScript
from tasks.settings import Settings, reset_settings
from tasks.store.db import session_scope
from tests.support.env import SANDBOX_ROOT
from tests.support.helpers import eventually, kinds
from tests.support.paths import ROOT
from tests.support.session import TEST_REDIS_URL
from tests.support.stack import Worker, worker_env

pytestmark = pytest.mark.slow
NOOP = ROOT / "examples" / "plays" / "noop.py"
QUICK = {
    "PLAYRUN_DEFERRAL_BASE_MS": "200",
    "PLAYRUN_DEFERRAL_MAX_MS": "1000",
    "PLAYRUN_SWEEP_INTERVAL_S": "0.5",
}


def org() -> str:
    return f"org-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def clean_slate(pg_url: str) -> Iterator[None]:
    """Normal policy and fresh buckets before and after each test."""
    def reset() -> None:
        policy.set_policy(policy.NORMAL, for_s=None)
        client = redis.Redis.from_url(TEST_REDIS_URL)
        for key in client.scan_iter(match="playrun:startrate:*"):
            client.delete(key)
        FakeScript(SANDBOX_ROOT).reset()
    reset()
    yield
    reset()


def start_worker(**env: str) -> Worker:
    w = Worker(worker_env(**{**QUICK, **env}), beat=True, concurrency=2)
    w.wait_ready()
    return w


def deferrals(run_id: str) -> list[dict[str, object]]:
    return [e.data for e in tasks.run_events(run_id) if e.kind == "run.deferred"]


def test_policy_cli_hold_throttle_normal_and_bad_input(pg_url: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tasks.cli.main", "policy", *args],
                              env=worker_env(), cwd=str(ROOT), capture_output=True, text=True,
                              timeout=60)

    assert '"mode": "hold_new_sandbox_starts"' in cli("hold", "--for", "10m").stdout
    shown = cli("throttle", "30", "--for", "1h").stdout
    assert '"mode": "sandbox_starts_per_minute"' in shown
    assert '"sandbox_starts_per_minute": 30' in shown
    assert '"mode": "normal"' in cli("normal").stdout
    assert '"mode": "normal"' in cli("show").stdout
    bad = cli("hold", "--for", "soon")
    assert bad.returncode == 2 and "DURATION_INVALID" in bad.stderr
    zero = cli("throttle", "0", "--for", "1m")
    assert zero.returncode == 2 and "POLICY_INVALID" in zero.stderr


def test_policies_expire_by_themselves(pg_url: str) -> None:
    policy.set_policy(policy.HOLD, for_s=0.5)
    assert policy.read().mode == policy.HOLD
    eventually(lambda: policy.read().mode == policy.NORMAL, timeout=10, what="hold to expire")
    policy.set_policy(policy.THROTTLE, for_s=0.5, starts_per_minute=12)
    assert policy.read().starts_per_minute == 12
    eventually(lambda: policy.read().mode == policy.NORMAL, timeout=10, what="throttle to expire")


def test_hold_defers_without_burning_the_attempt_then_the_run_completes(pg_url: str) -> None:
    w = start_worker()
    policy.set_policy(policy.HOLD, for_s=2)  # after the worker is up: a slow start eats none
    try:
        # Set once the worker is up: a slow start-up must not outlast the short hold.
        policy.set_policy(policy.HOLD, for_s=2)
        handle = tasks.submit_run(NOOP, input={}, org_id=org())
        eventually(lambda: deferrals(handle.id), what="a deferral")
        assert tasks.get_run(handle.id).status == "queued"
        result = handle.wait(timeout=60)
    finally:
        w.stop()
    assert result.status == "succeeded"
    causes = {d["cause"] for d in deferrals(handle.id)}
    assert causes == {"hold"}
    assert all(isinstance(d["delay_ms"], int) and d["delay_ms"] > 0 for d in deferrals(handle.id))
    view = tasks.get_run(handle.id)
    assert [a.generation for a in view.attempts] == [1]  # deferral is not a new generation
    assert kinds(handle.id).count("attempt.started") == 1


def test_deferral_budget_exhausted_fails_with_code_and_last_cause(pg_url: str) -> None:
    policy.set_policy(policy.HOLD, for_s=120)
    w = start_worker(PLAYRUN_DEFERRAL_MAX_COUNT="2")
    try:
        result = tasks.submit_run(NOOP, input={}, org_id=org()).wait(timeout=60)
    finally:
        w.stop()
    assert (result.status, result.code) == ("failed", "START_DEFERRAL_EXHAUSTED")
    assert result.error and "last cause: hold" in result.error


def test_long_deferrals_go_through_the_database_and_the_sweep(pg_url: str) -> None:
    """Waits longer than the largest countdown are never a Celery ETA: an outbox row
    with available_at, published by the beat sweep once due."""
    w = start_worker(PLAYRUN_MAX_COUNTDOWN_S="0.1", PLAYRUN_DEFERRAL_BASE_MS="1000")
    policy.set_policy(policy.HOLD, for_s=1.5)
    try:
        policy.set_policy(policy.HOLD, for_s=1.5)  # once the worker is up (see above)
        handle = tasks.submit_run(NOOP, input={}, org_id=org())
        assert handle.wait(timeout=60).status == "succeeded"
    finally:
        w.stop()
    assert deferrals(handle.id)
    with session_scope() as s:
        rows = s.execute(sa.select(Outbox.available_at, Outbox.sent_at, Outbox.created_at)
                         .where(Outbox.run_id == handle.id).order_by(Outbox.created_at)).all()
    later = rows[1:]
    assert later and all(sent is not None and sent >= avail for avail, sent, _ in later)


def test_throttle_paces_starts_fleet_wide(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In FIFO order every start is published at once, so the bucket defers some; the fair
    relay paces publishing instead (tests/e2e/test_fair_starts.py)."""
    monkeypatch.setenv("PLAYRUN_START_ORDER", "fifo")
    reset_settings()
    policy.set_policy(policy.THROTTLE, for_s=120, starts_per_minute=60)  # one a second
    # Waits past half a second defer: a slot a second apart is never waited for in place.
    w = start_worker(PLAYRUN_START_ORDER="fifo", PLAYRUN_START_LOCAL_SLEEP_MS="500")
    try:
        handles = [tasks.submit_run(NOOP, input={}, org_id=org()) for _ in range(4)]
        results = [h.wait(timeout=90) for h in handles]
    finally:
        w.stop()
        monkeypatch.undo()
        reset_settings()
    assert all(r.status == "succeeded" for r in results)
    starts = sorted(e.at for h in handles for e in tasks.run_events(h.id)
                    if e.kind == "sandbox.requested")
    gaps = [(b - a).total_seconds() for a, b in zip(starts, starts[1:], strict=False)]
    # Smooth pacing: one start a second (a little slack for the clock read after the permit).
    assert min(gaps) >= 0.9, gaps
    assert any(d["cause"] == "throttle" for h in handles for d in deferrals(h.id))


@pytest.mark.parametrize(("fault", "cause"), [("transport", "transport"),
                                              ("rate_limited", "provider_rate_limited"),
                                              ("capacity_unavailable", "provider_capacity")])
def test_provider_pushback_defers_then_succeeds(pg_url: str, fault: str, cause: str) -> None:
    FakeScript(SANDBOX_ROOT).set(fail_creates=[fault, fault])
    w = start_worker(PLAYRUN_SANDBOX_PROVIDER="fake", PLAYRUN_START_RATE_COOLDOWN_MS="300")
    try:
        handle = tasks.submit_run(NOOP, input={}, org_id=org())
        result = handle.wait(timeout=60)
    finally:
        w.stop()
    assert result.status == "succeeded"
    seen = [d["cause"] for d in deferrals(handle.id)]
    # Pushback also starts a cooldown, so a later try may be throttled before it succeeds.
    assert seen[0] == cause and seen.count(cause) == 2 and set(seen) <= {cause, "throttle"}
    assert [a.generation for a in tasks.get_run(handle.id).attempts] == [1]
    bucket = StartRateLimiter(redis.Redis.from_url(TEST_REDIS_URL))
    state = bucket.inspect("fake", rules_for(Settings(), "fake", None))[0]
    if cause == "transport":
        assert state.epoch == 0  # a transport failure is not provider pushback
    else:
        assert state.epoch >= 1 and state.rate < Settings().start_rate_initial_per_min


def test_pushback_slows_starts_and_the_rate_recovers(pg_url: str) -> None:
    """The provider admits 2 creates a second; the bucket starts at 10 a second, is cut
    by the pushback, every run still finishes, and once the provider has room again the
    rate climbs back."""
    script = FakeScript(SANDBOX_ROOT)
    script.set(max_creates_per_s=2)
    env = {"PLAYRUN_SANDBOX_PROVIDER": "fake", "PLAYRUN_START_RATE_INITIAL_PER_MIN": "600",
           "PLAYRUN_START_RATE_MAX_PER_MIN": "1200", "PLAYRUN_START_RATE_FLOOR_PER_MIN": "30",
           "PLAYRUN_START_RATE_INCREASE_PER_MIN": "60", "PLAYRUN_START_RATE_COOLDOWN_MS": "500",
           "PLAYRUN_DEFERRAL_MAX_COUNT": "50"}
    settings = Settings(**{k.removeprefix("PLAYRUN_").lower(): v for k, v in env.items()})
    bucket = StartRateLimiter(redis.Redis.from_url(TEST_REDIS_URL))
    rules = rules_for(settings, "fake", None)
    w = start_worker(**env)
    try:
        burst = [tasks.submit_run(NOOP, input={}, org_id=org()) for _ in range(16)]
        assert all(h.wait(timeout=120).status == "succeeded" for h in burst)
        after_burst = bucket.inspect("fake", rules)[0]
        assert after_burst.epoch >= 1 and after_burst.rate < 600
        assert script.state()["creates_rejected"].get("capacity_unavailable", 0) >= 1
        script.set(max_creates_per_s=None)
        calm = [tasks.submit_run(NOOP, input={}, org_id=org()) for _ in range(16)]
        assert all(h.wait(timeout=120).status == "succeeded" for h in calm)
        recovered = bucket.inspect("fake", rules)[0]
    finally:
        w.stop()
    assert recovered.rate > after_burst.rate
