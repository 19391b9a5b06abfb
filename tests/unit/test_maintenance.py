"""The reaper and the worker's maintenance tasks on SQLite, called directly: runs whose
worker vanished are adopted, inspected and settled; expired reservations and leftover
sandboxes are given back; the outbox sweep resends what was never published."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

import tasks
from models import Attempt, CapacityLease, Outbox, RuntimeResource, db_now
from tasks.broker.publish import StubPublisher
from tasks.constants import TASK_INSPECT_ATTEMPT, TASK_RELEASE_ATTEMPT, TASK_START_ATTEMPT
from tasks.maintenance import stats
from tasks.maintenance.reaper import reap
from tasks.sandbox.fake import FakeScript
from tasks.sandbox.fake_runners import EXIT_FILE
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tasks.worker import jobs
from tests.support.paths import NOOP
from tests.support.runs import event_kinds, lease, must_claim, new_run, reserve

pytestmark = pytest.mark.usefixtures("fake_stack")


def started(published: StubPublisher) -> str:
    run_id = tasks.submit_run(NOOP, {}, org_id=f"mt-{uuid.uuid4().hex[:8]}").id
    assert jobs.start_attempt(run_id) == "launched"
    published.sent.clear()
    return run_id


def expire(run_id: str, *, past_deadline: bool = False) -> None:
    values = {"lease_expires_at": db_now(-1)}
    if past_deadline:
        values["runner_deadline"] = db_now(-3600)
    with session_scope() as s:
        s.execute(sa.update(Attempt).where(Attempt.run_id == run_id).values(**values))


def sandbox_dir(run_id: str) -> Path:
    with session_scope() as s:
        sandbox_id = s.scalar(sa.select(RuntimeResource.sandbox_id)
                              .where(RuntimeResource.run_id == run_id))
    return Path(get_settings().sandbox_root) / str(sandbox_id)


def test_a_silent_launched_runner_is_inspected_and_lost_when_it_left_nothing(
        published: StubPublisher) -> None:
    run_id = started(published)
    expire(run_id)
    report = reap(get_settings())
    assert report.adopted_watch == [run_id]
    (message,) = [m for m in published.sent if m.name == TASK_INSPECT_ATTEMPT]
    # Still running on its host: it gets another heartbeat timeout, marked unreachable.
    jobs.inspect_attempt(*message.args)
    assert tasks.get_run(run_id).status == "running"
    assert "runner.unreachable" in event_kinds(run_id)
    # Its process ended without a result: the run failed as lost, its lease released.
    (sandbox_dir(run_id) / EXIT_FILE).write_text(json.dumps({"exit_code": 137}))
    jobs.inspect_attempt(*message.args)
    view = tasks.get_run(run_id)
    assert (view.status, view.code) == ("failed", "RUNTIME_RUNNER_LOST")
    with session_scope() as s:
        assert list(s.scalars(sa.select(CapacityLease.state)
                              .where(CapacityLease.run_id == run_id))) == ["released"]


def test_a_reported_exit_is_inspected_at_once_and_a_running_runner_left_alone(
        published: StubPublisher) -> None:
    run_id = started(published)
    with session_scope() as s:
        generation, token, lease_before = s.execute(sa.select(
            Attempt.generation, Attempt.lease_token, Attempt.lease_expires_at)
            .where(Attempt.run_id == run_id)).one()
    # Reported while it still runs (a report can only be early or forged): heartbeats decide.
    jobs.inspect_attempt(run_id, generation, token, True)
    assert tasks.get_run(run_id).status == "running"
    assert "runner.unreachable" not in event_kinds(run_id)
    with session_scope() as s:
        assert s.scalar(sa.select(Attempt.lease_expires_at)
                        .where(Attempt.run_id == run_id)) == lease_before
    # Its process ended without a result, lease still live: settled lost at once.
    (sandbox_dir(run_id) / EXIT_FILE).write_text(json.dumps({"exit_code": 0}))
    jobs.inspect_attempt(run_id, generation, token, True)
    view = tasks.get_run(run_id)
    assert (view.status, view.code) == ("failed", "RUNTIME_RUNNER_LOST")
    assert view.error == "the runner was lost: it exited with code 0 without a result"
    assert "runner.lost" in event_kinds(run_id)


def test_a_runner_far_past_its_deadline_is_settled_lost_by_the_reaper(
        published: StubPublisher) -> None:
    run_id = started(published)
    expire(run_id, past_deadline=True)
    report = reap(get_settings())
    assert report.settled_overdue == [run_id]
    assert tasks.get_run(run_id).code == "RUNTIME_RUNNER_LOST"
    assert [m.name for m in published.sent] == [TASK_RELEASE_ATTEMPT]
    jobs.release_attempt_task(*published.sent[0].args)
    assert not sandbox_dir(run_id).exists()


def test_an_attempt_lost_before_launch_is_deferred_and_its_reservation_expires(
        sqlite_db: str) -> None:
    org = f"mt-{uuid.uuid4().hex[:8]}"
    fence = must_claim(new_run(org), "gone-worker")
    lease_id = reserve(fence, org)
    with session_scope() as s:
        s.execute(sa.update(CapacityLease).where(CapacityLease.id == lease_id)
                  .values(expires_at=db_now(-1)))
    expire(fence.run_id)
    report = jobs.reap_attempts()
    assert report["reservations_expired"] == 1
    assert report["adopted_precode"] == [fence.run_id]
    assert lease(lease_id)[0] == "released"
    assert tasks.get_run(fence.run_id).status == "queued"  # to be started again
    assert "run.deferred" in event_kinds(fence.run_id)
    # Nothing is left to adopt: a second pass changes nothing.
    again = reap(get_settings())
    assert (again.adopted_precode, again.reservations_expired) == ([], 0)


def test_the_outbox_sweep_sends_starts_that_were_never_published(
        published: StubPublisher) -> None:
    published.fail = ConnectionError("broker down")
    handle = tasks.submit_run(NOOP, {}, org_id="mt-sweep")  # admitted all the same
    published.fail = None
    assert published.sent == [] and tasks.get_run(handle.id).status == "queued"
    with session_scope() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Outbox)
                        .where(Outbox.sent_at.is_(None))) == 1
    assert jobs.sweep_outbox() == 1
    assert [(m.name, m.args) for m in published.sent] == [(TASK_START_ATTEMPT, [handle.id])]
    assert jobs.sweep_outbox() == 0


def test_gc_deletes_a_sandbox_no_attempt_holds(published: StubPublisher,
                                               fake_stack: FakeScript) -> None:
    run_id = started(published)
    path = sandbox_dir(run_id)
    with session_scope() as s:  # as if its run's rows were gone and the sandbox forgotten
        s.execute(sa.delete(RuntimeResource).where(RuntimeResource.run_id == run_id))
    report = jobs.sandbox_gc()
    assert [(provider, sandbox_id) for provider, sandbox_id, _why in report["deleted"]] == [
        ("fake", path.name)]
    assert not path.exists()


def test_stats_count_runs_terminals_and_leases(published: StubPublisher) -> None:
    started(published)
    cancelled = tasks.submit_run(NOOP, {}, org_id="mt-stats").id
    tasks.cancel_run(cancelled)
    jobs.start_attempt(cancelled)
    figures = stats.collect(3600)
    assert figures.runs_by_status == {"running": 1, "cancelled": 1}
    assert figures.terminals == {"cancelled:CANCELLED": 1}
    assert sum(figures.leases_held_by_org.values()) == 1
    assert stats.as_dict(figures)["runs_by_status"]["running"] == 1
