"""Holder tokens: a late release by an earlier holder never touches the next holder's
lease; leftovers are released by the reaper; a cancel before launch wins."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

import tasks
from models import Attempt
from tasks.acquisition import deferral
from tasks.acquisition.claim import Claimed
from tasks.broker.publish import StubPublisher
from tasks.errors import FenceLostError
from tasks.execution.launch import mark_launching
from tasks.maintenance.reaper import ReapReport, retry_releases
from tasks.release.attempt import release_attempt
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tasks.store.fence import Fence, LaunchFence, hold_launch
from tests.support.helpers import eventually, kinds
from tests.support.runs import claim_now, lease, must_claim, new_run, reserve


def test_a_late_release_after_a_deferral_spares_the_resumed_holder(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, published: StubPublisher
) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"
    settings = get_settings().model_copy(update={"deferral_base_ms": 1, "deferral_max_ms": 2})
    a = must_claim(new_run(org), "A")
    lease_a = reserve(a, org)
    # A defers, but its release is slow: B resumes the same generation first.
    monkeypatch.setattr(deferral, "release_attempt", lambda *args: None)
    assert deferral.defer(a, "provider_capacity", settings) == "deferred"
    b = eventually(lambda: _try_claim(a.run_id, "B"), timeout=10, what="the run to be due")
    assert (b.generation, b.run_id) == (a.generation, a.run_id) and b.lease_token != a.lease_token
    lease_b = reserve(b, org)
    release_attempt(a.run_id, a.generation, a.lease_token)  # A's release lands only now
    assert (lease(lease_a)[0], lease(lease_b)[0]) == ("released", "reserved")


def test_the_reaper_releases_what_a_deferred_holder_left_behind(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, published: StubPublisher
) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"
    a = must_claim(new_run(org), "A")
    lease_a = reserve(a, org)
    monkeypatch.setattr(deferral, "release_attempt", lambda *args: None)  # the release failed
    assert deferral.defer(a, "hold", get_settings()) == "deferred"
    assert lease(lease_a)[0] == "reserved"
    retry_releases(ReapReport())
    assert lease(lease_a)[0] == "released"


def test_the_reaper_leaves_a_just_ended_attempt_to_its_own_release_task(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, published: StubPublisher
) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"
    a = must_claim(new_run(org), "A")
    lease_a = reserve(a, org)
    monkeypatch.setattr(deferral, "release_attempt", lambda *args: None)
    # A cancel ends the attempt (ended_at is now) and its release is "on its way".
    tasks.cancel_run(a.run_id)
    assert deferral.defer(a, "hold", get_settings()) == "cancelled"
    retry_releases(ReapReport(), grace_s=60)
    assert lease(lease_a)[0] == "reserved"  # within the grace: not the reaper's yet
    retry_releases(ReapReport(), grace_s=0)
    assert lease(lease_a)[0] == "released"


def _launch_record(f: Fence) -> tuple[str | None, object]:
    with session_scope() as session:
        row = session.execute(sa.select(Attempt.launch_id, Attempt.runner_started_at).where(
            Attempt.run_id == f.run_id, Attempt.generation == f.generation)).one()
        return row[0], row[1]


def test_a_cancel_before_launch_wins_and_nothing_starts(pg_url: str) -> None:
    f = must_claim(new_run(f"org-{uuid.uuid4().hex[:8]}"), "A")
    tasks.cancel_run(f.run_id)  # the attempt is active, so only the request is recorded
    assert tasks.get_run(f.run_id).status == "running"
    assert mark_launching(f, get_settings()) is None  # cancelled: no launch recorded
    assert _launch_record(f) == (None, None)  # no launch id, no runner start time
    assert not {"sandbox.requested", "sandbox.live"} & set(kinds(f.run_id))
    # Without the cancel the same call records a launch: the check above can fail.
    g = must_claim(new_run(f"org-{uuid.uuid4().hex[:8]}"), "A")
    launch_id = mark_launching(g, get_settings())
    assert launch_id is not None and _launch_record(g)[0] == launch_id


def test_a_cancel_during_acquisition_wins_over_a_deferral(
        pg_url: str, published: StubPublisher) -> None:
    f = must_claim(new_run(f"org-{uuid.uuid4().hex[:8]}"), "A")
    tasks.cancel_run(f.run_id)
    assert deferral.defer(f, "hold", get_settings()) == "cancelled"
    view = tasks.get_run(f.run_id)
    assert (view.status, view.code) == ("cancelled", "CANCELLED")


def _try_claim(run_id: str, worker: str) -> Fence | None:
    result = claim_now(run_id, worker)
    return result.fence if isinstance(result, Claimed) else None


def test_a_runner_launched_before_a_deferral_holds_no_fence_after_the_resume(
    pg_url: str, published: StubPublisher
) -> None:
    settings = get_settings().model_copy(update={"deferral_base_ms": 1, "deferral_max_ms": 2})
    a = must_claim(new_run(f"org-{uuid.uuid4().hex[:8]}"), "A")
    launch_id = mark_launching(a, settings)
    assert launch_id is not None
    # Its runner never took the run (a standby lost, say): the attempt waits, then resumes.
    assert deferral.defer(a, "hold", settings) == "deferred"
    b = eventually(lambda: _try_claim(a.run_id, "B"), timeout=10, what="the run to be due")
    assert b.generation == a.generation
    stale = LaunchFence(a.run_id, a.generation, launch_id)
    with pytest.raises(FenceLostError), session_scope() as session:
        hold_launch(session, stale)  # before B records a launch of its own
    assert _launch_record(b) == (None, None)
