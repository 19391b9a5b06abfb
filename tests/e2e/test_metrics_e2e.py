"""The metrics endpoints of a real worker, gateway and beat after a known mix of runs.

Three runs on the fake provider: one deferred once by provider pushback (one penalty)
and then succeeded, one whose runner is lost (failed RUNTIME_RUNNER_LOST, found by
beat's reaper), one that runs a step and succeeded. Each endpoint is parsed with
prometheus_client's parser; the counters summed over the processes have exactly the
values of that mix.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client import REGISTRY

import tasks
from tasks.acquisition.startrate import StartRateLimiter, rules_for
from tasks.host.processes import free_port
from tasks.sandbox import FakeScript
from tasks.security import tokens
from tasks.settings import Settings, get_settings
from tests.support.env import GATEWAY_DIR, SANDBOX_ROOT
from tests.support.helpers import eventually
from tests.support.metrics import beat, endpoint, scrape, summed
from tests.support.paths import PLAYS, ROOT
from tests.support.runs import close_open_runs, must_claim, new_run, reserve
from tests.support.session import TEST_REDIS_URL
from tests.support.stack import Gateway, Worker, worker_env

pytestmark = pytest.mark.slow
NOOP = ROOT / "examples" / "plays" / "noop.py"
ORGS = "me-"
ENV = {
    "PLAYRUN_SANDBOX_PROVIDER": "fake",
    "PLAYRUN_START_RATE_INITIAL_PER_MIN": "6000",  # never throttled: only the pushback defers
    "PLAYRUN_START_RATE_MAX_PER_MIN": "12000",
    # No hold after the pushback (only the cut): the retry is never throttled.
    "PLAYRUN_START_RATE_COOLDOWN_MS": "0",
    "PLAYRUN_DEFERRAL_BASE_MS": "200",
    "PLAYRUN_DEFERRAL_MAX_MS": "500",
    "PLAYRUN_SWEEP_INTERVAL_S": "0.5",
}
VARIABLE_ACTIONS = ("heartbeat", "append_run_events")  # as many as timing makes


@pytest.fixture
def stack(pg_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Own gateway, worker and beat, so every counter starts at zero."""
    port = free_port()
    env = worker_env(**ENV, PLAYRUN_GATEWAY_URL=f"http://127.0.0.1:{port}",
                     PLAYRUN_GATEWAY_SOCKET=str(GATEWAY_DIR / f"m{port}" / "gateway.sock"),
                     PLAYRUN_METRICS_DIR=str(tmp_path / "metrics"))
    script = FakeScript(SANDBOX_ROOT)
    script.reset()
    # Runs earlier modules left open would be this beat's to reap, and its counters'.
    close_open_runs("")
    for key in redis.Redis.from_url(TEST_REDIS_URL).scan_iter(match="playrun:startrate:*"):
        redis.Redis.from_url(TEST_REDIS_URL).delete(key)
    gateway = Gateway(env, workers=2)  # the endpoint sums both processes' counters
    worker = Worker(env, beat=False)
    beat_proc = beat(env)
    try:
        worker.wait_ready()
        urls = {"gateway": endpoint(env, "gateway", gateway.proc),  # type: ignore[arg-type]
                "worker": endpoint(env, "worker", worker.proc),
                "beat": endpoint(env, "beat", beat_proc.proc)}
        yield {**env, **{f"url_{k}": v for k, v in urls.items()}}
    finally:
        beat_proc.stop()
        worker.stop()
        gateway.stop()
        # Shown by pytest only when the test failed (the periodic maintenance left out).
        quiet = [line for line in worker.output().splitlines()
                 if "sweep_outbox" not in line and "playrun.reap" not in line]
        print("--- worker\n", "\n".join(quiet)[-6000:], "\n--- beat\n",
              beat_proc.output()[-2000:], "\n--- gateway\n", gateway.output()[-2000:])
        script.reset()
        close_open_runs(ORGS)


def org() -> str:
    return f"{ORGS}{uuid.uuid4().hex[:8]}"


def test_counters_after_a_known_mix_of_runs(stack: dict[str, str]) -> None:
    script = FakeScript(SANDBOX_ROOT)
    admitted = REGISTRY.get_sample_value("playrun_runs_admitted_total") or 0.0

    script.set(fail_creates=["capacity_unavailable"])
    pushed_back = tasks.submit_run(NOOP, input={}, org_id=(pushed_org := org()))
    assert pushed_back.wait(timeout=60).status == "succeeded"
    script.set(lose_runner=1)
    lost = tasks.submit_run(NOOP, input={}, org_id=(lost_org := org()))
    assert lost.wait(timeout=90).code == "RUNTIME_RUNNER_LOST"
    script.reset()
    stepped = tasks.submit_run(PLAYS / "steps.py", input={"counter": "paid.txt"},
                               org_id=(stepped_org := org()))
    assert stepped.wait(timeout=60).status == "succeeded"
    assert REGISTRY.get_sample_value("playrun_runs_admitted_total") == admitted + 3

    gw = stack["PLAYRUN_GATEWAY_URL"] + "/v1/runtime"
    forged = httpx.post(gw, json={"action": "heartbeat"},
                        headers={"Authorization": "Bearer not-a-token"}, timeout=10)
    assert forged.status_code == 401
    hostile_name = "evil_" + uuid.uuid4().hex
    token = tokens.mint(org_id="x", run_id=uuid.uuid4().hex, generation=1,
                        launch_id=uuid.uuid4().hex, capabilities=tokens.RUNNER_CAPABILITIES,
                        ttl_s=60, secret=get_settings().secret_key)
    unknown = httpx.post(gw, json={"action": hostile_name},
                         headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert unknown.status_code == 404

    def labels(**kw: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(kw.items()))

    expected = {
        ("playrun_runs_ended_total", labels(status="succeeded", code="none")): 2,
        ("playrun_runs_ended_total", labels(status="failed", code="RUNTIME_RUNNER_LOST")): 1,
        ("playrun_runners_lost_total", ()): 1,
        ("playrun_submit_to_terminal_seconds_count", labels(status="succeeded")): 2,
        ("playrun_submit_to_terminal_seconds_count", labels(status="failed")): 1,
        ("playrun_submit_to_start_seconds_count", ()): 3,
        ("playrun_start_permits_total", labels(bucket="fake", decision="granted")): 4,
        ("playrun_start_rate_penalties_total", labels(bucket="fake")): 1,
        # Permits granted by org: the pushed-back run's create was tried twice.
        ("playrun_starts_total", labels(org=pushed_org)): 2,
        ("playrun_starts_total", labels(org=lost_org)): 1,
        ("playrun_starts_total", labels(org=stepped_org)): 1,
        ("playrun_deferrals_total", labels(cause="provider_capacity")): 1,
        ("playrun_provider_creates_total", labels(provider="fake", result="ok")): 3,
        ("playrun_provider_creates_total",
         labels(provider="fake", result="capacity_unavailable")): 1,
        ("playrun_receipts_total", labels(outcome="executed")): 1,
        ("playrun_gateway_requests_total", labels(action="complete", code="ok")): 2,
        ("playrun_gateway_requests_total", labels(action="step_claim", code="ok")): 1,
        ("playrun_gateway_requests_total", labels(action="step_complete", code="ok")): 1,
        ("playrun_gateway_requests_total",
         labels(action="unknown", code="GATEWAY_TOKEN_INVALID")): 1,
        ("playrun_gateway_requests_total",
         labels(action="unknown", code="GATEWAY_UNKNOWN_ACTION")): 1,
        # A valid token's refusal is counted by its org too (an invalid one names none).
        ("playrun_gateway_refusals_total", labels(org="x", code="GATEWAY_UNKNOWN_ACTION")): 1,
        ("playrun_gateway_request_duration_seconds_count", labels(action="complete")): 2,
        ("playrun_gateway_request_duration_seconds_count", labels(action="step_claim")): 1,
        ("playrun_gateway_request_duration_seconds_count", labels(action="step_complete")): 1,
        ("playrun_gateway_request_duration_seconds_count", labels(action="unknown")): 2,
    }

    def counted() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        both = summed(scrape(stack["url_worker"]), scrape(stack["url_gateway"]))
        return {k: v for k, v in both.items() if not k[0].endswith("_sum")
                and dict(k[1]).get("action") not in VARIABLE_ACTIONS}

    # The release after each terminal runs after the run is seen settled: poll until the
    # totals are reached, then they must be exactly the mix (a double count never settles).
    eventually(lambda: sum(counted().values()) >= sum(expected.values()), timeout=30,
               what="the counters of the mix")
    assert counted() == expected
    gateway_text = httpx.get(stack["url_gateway"], timeout=10).text
    assert hostile_name not in gateway_text  # untrusted names never become labels


def test_beat_serves_start_rate_and_capacity_state(stack: dict[str, str]) -> None:
    settings = Settings(**{k.removeprefix("PLAYRUN_").lower(): v for k, v in ENV.items()})
    rules = rules_for(settings, "fake", None)
    bucket = StartRateLimiter(redis.Redis.from_url(TEST_REDIS_URL))
    assert bucket.penalize("fake", rules, 0, 60_000)  # as a worker does on pushback
    holder = org()
    reserve(must_claim(new_run(holder)), holder)
    samples = scrape(stack["url_beat"])
    close_open_runs(ORGS)
    state = bucket.inspect("fake", rules)[0]
    rule = (("bucket", "fake"), ("rule", "provider"))
    assert samples[("playrun_state_source_up", (("source", "database"),))] == 1.0
    assert samples[("playrun_state_source_up", (("source", "redis"),))] == 1.0
    assert samples[("playrun_start_rate_per_second", rule)] == pytest.approx(state.rate / 60)
    assert state.rate == pytest.approx(6000 * settings.start_rate_decrease_factor)
    assert 50 < samples[("playrun_start_rate_cooldown_seconds", rule)] <= 60
    assert samples[("playrun_capacity_leases",
                    (("org", holder), ("state", "reserved")))] == 1.0
    worker_samples = scrape(stack["url_worker"])
    assert not any(k[0].startswith("playrun_capacity") for k in worker_samples)  # beat's only


def test_a_worker_empties_its_directory_at_start_and_removes_it_at_stop(
        pg_url: str, tmp_path: Path) -> None:
    root = tmp_path / "metrics"
    dead = subprocess.Popen(["true"])  # a pid that has exited
    dead.wait()
    stale_dir = root / f"worker-{dead.pid}"
    stale_dir.mkdir(parents=True)
    (stale_dir / "counter_1.db").write_bytes(b"old")
    (root / f"gateway-{dead.pid}.url").write_text("http://127.0.0.1:1/metrics")
    env = worker_env(PLAYRUN_METRICS_DIR=str(root))
    worker = Worker(env, beat=False)
    try:
        worker.wait_ready()
        url = endpoint(env, "worker", worker.proc)
        assert not stale_dir.exists() and not (root / f"gateway-{dead.pid}.url").exists()
        own = root / f"worker-{worker.proc.pid}"
        assert own.is_dir()
        assert scrape(url) is not None  # serves (nothing counted yet)
    finally:
        worker.stop()
    assert not own.exists() and not (root / f"worker-{worker.proc.pid}.url").exists()
