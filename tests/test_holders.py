"""Holder tokens: a late release by an earlier holder never touches the next holder's
lease; leftovers are released by the reaper; a cancel before launch wins."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa

import tasks
from models import CapacityLease
from tasks.acquisition import capacity, deferral
from tasks.acquisition.claim import Claimed, claim
from tasks.admission.submit import admit
from tasks.db import session_scope
from tasks.execution.launch import mark_launching
from tasks.fence import Fence, hold
from tasks.maintenance.reaper import ReapReport, retry_releases
from tasks.release.attempt import release_attempt
from tasks.settings import get_settings
from tests.conftest import ROOT
from tests.helpers import eventually


class StubApp:
    """Stands in for the Celery app's publish only; the outbox row stays for the sweep."""

    def send_task(self, *args: Any, **kwargs: Any) -> None:
        raise ConnectionError("no broker in this test")


def new_claim(org: str, worker: str) -> Fence:
    run_id = admit(ROOT / "examples" / "plays" / "noop.py", {}, org, None).run_id
    return claim_again(run_id, worker)


def claim_again(run_id: str, worker: str) -> Fence:
    with session_scope() as s:
        c = claim(s, run_id, worker_id=worker, lease_seconds=30)
    assert isinstance(c, Claimed), c
    return c.fence


def reserve(fence: Fence, org: str) -> str:
    with session_scope() as s:
        hold(s, fence)
        return capacity.reserve(s, fence, org, get_settings()).lease_id


def state(lease_id: str) -> str:
    with session_scope() as s:
        return str(s.scalar(sa.select(CapacityLease.state).where(CapacityLease.id == lease_id)))


def test_a_late_release_after_a_deferral_spares_the_resumed_holder(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"
    settings = get_settings().model_copy(update={"deferral_base_ms": 1, "deferral_max_ms": 2})
    a = new_claim(org, "A")
    lease_a = reserve(a, org)
    # A defers, but its release is slow: B resumes the same generation first.
    monkeypatch.setattr(deferral, "release_attempt", lambda *args: None)
    assert deferral.defer(a, "provider_capacity", settings, StubApp()) == "deferred"
    b = eventually(lambda: _try_claim(a.run_id, "B"), timeout=10, what="the run to be due")
    assert (b.generation, b.run_id) == (a.generation, a.run_id) and b.lease_token != a.lease_token
    lease_b = reserve(b, org)
    release_attempt(a.run_id, a.generation, a.lease_token)  # A's release lands only now
    assert (state(lease_a), state(lease_b)) == ("released", "reserved")


def test_the_reaper_releases_what_a_deferred_holder_left_behind(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"
    a = new_claim(org, "A")
    lease_a = reserve(a, org)
    monkeypatch.setattr(deferral, "release_attempt", lambda *args: None)  # the release failed
    assert deferral.defer(a, "hold", get_settings(), StubApp()) == "deferred"
    assert state(lease_a) == "reserved"
    retry_releases(ReapReport())
    assert state(lease_a) == "released"


def test_a_cancel_before_launch_wins_and_nothing_starts(pg_url: str) -> None:
    f = new_claim(f"org-{uuid.uuid4().hex[:8]}", "A")
    tasks.cancel_run(f.run_id)  # the attempt is active, so only the request is recorded
    assert tasks.get_run(f.run_id).status == "running"
    assert mark_launching(f, get_settings()) == "cancelled"


def test_a_cancel_during_acquisition_wins_over_a_deferral(pg_url: str) -> None:
    f = new_claim(f"org-{uuid.uuid4().hex[:8]}", "A")
    tasks.cancel_run(f.run_id)
    assert deferral.defer(f, "hold", get_settings(), StubApp()) == "cancelled"
    view = tasks.get_run(f.run_id)
    assert (view.status, view.code) == ("cancelled", "CANCELLED")


def _try_claim(run_id: str, worker: str) -> Fence | None:
    with session_scope() as s:
        c = claim(s, run_id, worker_id=worker, lease_seconds=30)
    return c.fence if isinstance(c, Claimed) else None
