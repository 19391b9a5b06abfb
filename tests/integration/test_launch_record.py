"""The launch record (sandbox live, lease promoted, launch marked) on PostgreSQL: the
one-statement common case, and every other case through the general transaction, with
the same rows and errors either way."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from models import Attempt, CapacityLease, Run, RunEvent, RuntimeResource, db_now
from tasks.errors import FenceLostError
from tasks.execution.launch import record_launch
from tasks.sandbox import SandboxRef
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tasks.store.fence import Fence
from tests.support.runs import (
    ORG_PREFIX,
    close_open_runs,
    event_kinds,
    must_claim,
    new_run,
    reserve,
)


@pytest.fixture(scope="module", autouse=True)
def _no_open_runs_left(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)  # no later module's reaper adopts what these left open


def claimed() -> tuple[Fence, str]:
    org = f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}"
    fence = must_claim(new_run(org), "t")
    return fence, reserve(fence, org)


def ref() -> SandboxRef:
    return SandboxRef("fake", f"fsb-{uuid.uuid4().hex[:12]}", {"playrun": "1"}, time.time())


def attempt_of(fence: Fence) -> Attempt:
    with session_scope() as s:
        attempt = s.scalars(sa.select(Attempt).where(
            Attempt.run_id == fence.run_id, Attempt.generation == fence.generation)).one()
        s.expunge(attempt)
        return attempt


def rows(fence: Fence) -> tuple[dict[str, str], list[tuple[str, str | None]]]:
    with session_scope() as s:
        resources = dict(s.execute(sa.select(RuntimeResource.sandbox_id, RuntimeResource.state)
                                   .where(RuntimeResource.run_id == fence.run_id)).all())
        leases = [tuple(r) for r in s.execute(
            sa.select(CapacityLease.state, CapacityLease.sandbox_id)
            .where(CapacityLease.run_id == fence.run_id))]
    return resources, leases  # type: ignore[return-value]


def test_a_launch_records_everything_in_one_go(pg_url: str) -> None:
    fence, lease = claimed()
    sandbox = ref()
    settings = get_settings()
    before = time.time()
    mark = record_launch(fence, settings, sandbox, lease)
    assert mark is not None and abs(mark.db_time - before) < 60
    attempt = attempt_of(fence)
    assert (attempt.launch_id, attempt.sandbox_id, attempt.provider) == (
        mark.launch_id, sandbox.sandbox_id, "fake")
    assert attempt.runner_started_at is not None and attempt.runner_deadline is not None
    with session_scope() as s:
        deadline_s, lease_s = s.execute(sa.select(
            sa.func.extract("epoch", Attempt.runner_deadline - Attempt.runner_started_at),
            sa.func.extract("epoch", Attempt.lease_expires_at - db_now()))
            .where(Attempt.id == attempt.id)).one()
    want = settings.run_timeout_s + 5 + settings.heartbeat_timeout_s
    assert abs(float(deadline_s) - want) < 1
    assert 0 < float(lease_s) <= settings.heartbeat_timeout_s + 10
    assert rows(fence) == ({sandbox.sandbox_id: "live"}, [("live", sandbox.sandbox_id)])
    assert event_kinds(fence.run_id).count("sandbox.live") == 1


def test_the_same_sandbox_reported_twice_is_success_and_one_event(pg_url: str) -> None:
    fence, lease = claimed()
    sandbox = ref()
    first = record_launch(fence, get_settings(), sandbox, lease)
    again = record_launch(fence, get_settings(), sandbox, lease)
    assert first is not None and again is not None and again.launch_id != first.launch_id
    assert attempt_of(fence).launch_id == again.launch_id  # the later launch is the one
    assert rows(fence) == ({sandbox.sandbox_id: "live"}, [("live", sandbox.sandbox_id)])
    assert event_kinds(fence.run_id).count("sandbox.live") == 1


def test_a_stale_token_writes_nothing_but_the_cleanup_record(pg_url: str) -> None:
    fence, lease = claimed()
    sandbox = ref()
    stale = Fence(fence.run_id, fence.generation, "not-the-token")
    with pytest.raises(FenceLostError, match="lost its lease"):
        record_launch(stale, get_settings(), sandbox, lease)
    assert rows(fence) == ({sandbox.sandbox_id: "cleanup"}, [("reserved", None)])
    assert attempt_of(fence).launch_id is None
    assert "sandbox.live" not in event_kinds(fence.run_id)


def test_a_lease_no_longer_reserved_is_a_fence_loss_naming_the_lease(pg_url: str) -> None:
    fence, lease = claimed()
    with session_scope() as s:
        s.execute(sa.update(CapacityLease).where(CapacityLease.id == lease)
                  .values(state="expired"))
    sandbox = ref()
    with pytest.raises(FenceLostError, match=f"capacity lease {lease} is expired"):
        record_launch(fence, get_settings(), sandbox, lease)
    assert rows(fence) == ({sandbox.sandbox_id: "cleanup"}, [("expired", None)])
    assert attempt_of(fence).launch_id is None


def test_a_cancel_recorded_first_keeps_the_sandbox_on_record_and_launches_nothing(
        pg_url: str) -> None:
    fence, lease = claimed()
    with session_scope() as s:
        s.execute(sa.update(Run).where(Run.id == fence.run_id)
                  .values(cancel_requested_at=db_now()))
    sandbox = ref()
    assert record_launch(fence, get_settings(), sandbox, lease) is None
    # On record and its lease live, so the release deletes it and frees the slot.
    assert rows(fence) == ({sandbox.sandbox_id: "live"}, [("live", sandbox.sandbox_id)])
    assert attempt_of(fence).launch_id is None


def test_without_a_lease_the_launch_is_recorded_too(pg_url: str) -> None:
    fence = must_claim(new_run(), "t")
    sandbox = ref()
    mark = record_launch(fence, get_settings(), sandbox, None)
    assert mark is not None and attempt_of(fence).launch_id == mark.launch_id
    assert rows(fence) == ({sandbox.sandbox_id: "live"}, [])


@pytest.mark.parametrize("one_statement", [True, False])
def test_the_launch_writes_the_request_it_owes_dated_back_to_the_ask(
        pg_url: str, one_statement: bool) -> None:
    """A sandbox made on PostgreSQL owes its `sandbox.requested` event (tasks/acquisition/
    sandbox.py); the launch record writes it before `sandbox.live`, dated when the provider
    was asked, in the one statement and in the general transaction (a provider pool)."""
    fence, lease = claimed()
    sandbox = dataclasses.replace(ref(), requested_at=time.monotonic() - 2.0)
    settings = get_settings() if one_statement else \
        get_settings().model_copy(update={"provider_max_live": 1000})
    assert record_launch(fence, settings, sandbox, None if not one_statement else lease)
    with session_scope() as s:
        events = s.execute(sa.select(RunEvent.kind, RunEvent.at, RunEvent.data)
                           .where(RunEvent.run_id == fence.run_id).order_by(RunEvent.id)).all()
    kinds = [e.kind for e in events]
    assert kinds[-2:] == ["sandbox.requested", "sandbox.live"] and kinds.count(
        "sandbox.requested") == 1
    asked, live = events[-2], events[-1]
    assert asked.data == {"provider": "fake"}
    assert 1.5 < (live.at - asked.at).total_seconds() < 10
