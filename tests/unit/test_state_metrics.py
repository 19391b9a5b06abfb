"""What a Prometheus scrape of the fleet's state shows, from SQLite: leases held per org and
state, each org's limit, and which sources answered."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import tasks
from tasks.acquisition import capacity
from tasks.broker.publish import StubPublisher
from tasks.maintenance.state_metrics import StateCollector
from tasks.sandbox.fake import FakeScript
from tasks.settings import get_settings, reset_settings
from tasks.worker import jobs
from tests.support.paths import NOOP


def scrape() -> str:
    registry = CollectorRegistry()
    registry.register(StateCollector(get_settings()))
    return generate_latest(registry).decode()


def test_leases_limits_and_sources_are_shown(fake_stack: FakeScript,
                                             published: StubPublisher) -> None:
    org = f"sm-{uuid.uuid4().hex[:6]}"
    capacity.set_limit(org, 3)
    for _ in range(2):
        assert jobs.start_attempt(tasks.submit_run(NOOP, {}, org_id=org).id) == "launched"
    text = scrape()
    assert f'playrun_capacity_leases{{org="{org}",state="live"}} 2.0' in text
    assert f'playrun_capacity_limit{{org="{org}"}} 3.0' in text
    assert 'playrun_provider_sandboxes_live{provider="fake"} 2.0' in text
    assert 'playrun_state_source_up{source="database"} 1.0' in text
    assert 'playrun_state_source_up{source="redis"} 0.0' in text
    assert "playrun_start_rate_per_second" not in text  # nothing to show, not zeros


def test_a_database_that_does_not_answer_is_shown_down(
        fake_stack: FakeScript, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAYRUN_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:1/x")
    monkeypatch.setenv("PLAYRUN_SECRET_KEY", "s" * 40)
    reset_settings()
    text = scrape()
    assert 'playrun_state_source_up{source="database"} 0.0' in text
    assert "playrun_capacity_leases" not in text
