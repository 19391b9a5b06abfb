"""A run's start on SQLite: the worker's start task called directly, with the `fake`
provider (runners handed to a runner host that is not running) and an in-memory limiter."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

import tasks
from models import Attempt, CapacityLease, RuntimeResource
from tasks.broker.publish import StubPublisher
from tasks.sandbox.fake import FakeScript
from tasks.store.db import session_scope
from tasks.worker import jobs
from tests.support.paths import NOOP

pytestmark = pytest.mark.usefixtures("fake_stack")


def submit(published: StubPublisher, org: str | None = None) -> str:
    return tasks.submit_run(NOOP, {}, org_id=org or f"st-{uuid.uuid4().hex[:8]}").id


def attempts(run_id: str) -> list[tuple[int, str, str | None]]:
    with session_scope() as s:
        return [tuple(r) for r in s.execute(
            sa.select(Attempt.generation, Attempt.state, Attempt.end_reason)
            .where(Attempt.run_id == run_id).order_by(Attempt.generation))]


def leases(run_id: str) -> list[str]:
    with session_scope() as s:
        return list(s.scalars(sa.select(CapacityLease.state)
                              .where(CapacityLease.run_id == run_id)))


def test_a_start_launches_the_runner_and_holds_a_live_lease(
        published: StubPublisher, fake_stack: FakeScript) -> None:
    run_id = submit(published)
    assert [m.args[0] for m in published.sent] == [run_id]
    assert jobs.start_attempt(run_id) == "launched"
    view = tasks.get_run(run_id)
    assert view.status == "running"
    assert attempts(run_id) == [(1, "active", None)]
    assert leases(run_id) == ["live"]
    with session_scope() as s:
        assert s.scalar(sa.select(RuntimeResource.state)
                        .where(RuntimeResource.run_id == run_id)) == "live"
    assert fake_stack.state()["creates_ok"] == 1
    # A second delivery of the same message finds the run claimed: nothing new starts.
    assert jobs.start_attempt(run_id) != "launched"
    assert fake_stack.state()["creates_ok"] == 1


def test_a_cancelled_queued_run_is_settled_by_its_start(published: StubPublisher) -> None:
    run_id = submit(published)
    tasks.cancel_run(run_id)
    jobs.start_attempt(run_id)
    assert (tasks.get_run(run_id).status, tasks.get_run(run_id).code) == (
        "cancelled", "CANCELLED")


def test_a_refused_create_defers_and_an_auth_failure_ends_the_run(
        published: StubPublisher, fake_stack: FakeScript) -> None:
    fake_stack.set(fail_creates=["capacity_unavailable"], hosted_runners=True)
    waiting = submit(published)
    assert jobs.start_attempt(waiting) == "deferred"
    assert tasks.get_run(waiting).status == "queued"
    assert leases(waiting) == ["released"]
    fake_stack.set(fail_creates=["auth"], hosted_runners=True)
    failed = submit(published)
    assert jobs.start_attempt(failed) == "failed"
    view = tasks.get_run(failed)
    assert (view.status, view.code) == ("failed", "SANDBOX_START_FAILED")


def test_a_full_org_fails_with_capacity_exceeded(
        published: StubPublisher, monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.settings import reset_settings

    monkeypatch.setenv("PLAYRUN_ORG_CAPACITY", "1")
    monkeypatch.setenv("PLAYRUN_CAPACITY_FULL", "fail")
    reset_settings()
    org = f"full-{uuid.uuid4().hex[:6]}"
    first, second = submit(published, org), submit(published, org)
    assert jobs.start_attempt(first) == "launched"
    assert jobs.start_attempt(second) == "failed"
    assert tasks.get_run(second).code == "SANDBOX_CAPACITY_EXCEEDED"


def test_cancelling_a_running_run_deletes_its_sandbox_and_frees_its_lease(
        published: StubPublisher, fake_stack: FakeScript) -> None:
    run_id = submit(published)
    jobs.start_attempt(run_id)
    jobs.cancel_attempt(run_id)
    view = tasks.get_run(run_id)
    assert (view.status, view.code) == ("cancelled", "CANCELLED")
    assert leases(run_id) == ["released"]
    with session_scope() as s:
        assert s.scalar(sa.select(RuntimeResource.state)
                        .where(RuntimeResource.run_id == run_id)) != "live"
