"""Helpers shared by the tests that drive the run lifecycle by hand (no worker).

Spawned child processes import the test modules that use these, so this module must
not import tests.conftest or tests.support.session.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from models import Attempt, CapacityLease, Outbox, Run, RunEvent, RuntimeResource, db_now
from tasks.acquisition import capacity
from tasks.acquisition.claim import Claimed, Skipped, claim
from tasks.admission.submit import admit
from tasks.constants import TERMINAL_STATUSES, AttemptState
from tasks.execution.launch import record_launch
from tasks.sandbox import SandboxRef
from tasks.settings import Settings, get_settings
from tasks.settlement.outcome import Outcome
from tasks.store.db import session_scope
from tasks.store.fence import Fence, LaunchFence
from tests.support.paths import NOOP

# Workers that must not be paced by the start-rate bucket (tests about something else).
FAST_STARTS = {"PLAYRUN_START_RATE_INITIAL_PER_MIN": "6000",
               "PLAYRUN_START_RATE_MAX_PER_MIN": "12000"}
TERMINAL_EVENTS = ("run.succeeded", "run.failed", "run.cancelled")
# Worker settings for tests that recover from killed workers: short leases, fast passes.
FAST_RECOVERY = {
    "PLAYRUN_LEASE_SECONDS": "3",
    "PLAYRUN_REAP_INTERVAL_S": "1",
    "PLAYRUN_SWEEP_INTERVAL_S": "1",
}

# Workers whose plays prove they ran once by appending to a file on the host (counter.py):
# only process isolation lets a play write outside its sandbox.
HOST_FILES = {"PLAYRUN_SANDBOX_ISOLATION": "process"}

ORG_PREFIX = "fen-"


def new_run(org_id: str | None = None) -> str:
    """Admit a run the way submit_run does, but keep it off the broker (the test drives it)."""
    admitted = admit(NOOP, {}, org_id or f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}", None)
    with session_scope() as session:
        session.execute(sa.update(Outbox).where(Outbox.id == admitted.outbox_id)
                        .values(sent_at=db_now()))
    return admitted.run_id


def claim_now(run_id: str, worker: str = "w", lease_seconds: float = 30.0) -> Claimed | Skipped:
    with session_scope() as session:
        return claim(session, run_id, worker_id=worker, lease_seconds=lease_seconds)


def must_claim(run_id: str, worker: str = "w", lease_seconds: float = 30.0) -> Fence:
    result = claim_now(run_id, worker, lease_seconds)
    assert isinstance(result, Claimed), result
    return result.fence


def snapshot(run_id: str) -> dict[str, Any]:
    """Everything a write on behalf of an attempt could change, as plain values."""
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        attempts = session.execute(
            sa.select(Attempt.generation, Attempt.lease_token, Attempt.state,
                      Attempt.lease_expires_at, Attempt.end_reason, Attempt.sandbox_id,
                      Attempt.worker_id)
            .where(Attempt.run_id == run_id).order_by(Attempt.generation)).all()
        events = session.execute(
            sa.select(RunEvent.id, RunEvent.kind, RunEvent.generation)
            .where(RunEvent.run_id == run_id).order_by(RunEvent.id)).all()
        leases = session.execute(
            sa.select(CapacityLease.id, CapacityLease.state, CapacityLease.sandbox_id)
            .where(CapacityLease.run_id == run_id).order_by(CapacityLease.id)).all()
        resources = session.execute(
            sa.select(RuntimeResource.sandbox_id, RuntimeResource.state)
            .where(RuntimeResource.run_id == run_id).order_by(RuntimeResource.sandbox_id)).all()
        return {
            "run": (run.status, run.code, run.error, run.output, run.current_generation,
                    run.finished_at, run.updated_at),
            "attempts": [tuple(a) for a in attempts],
            "events": [tuple(e) for e in events],
            "leases": [tuple(x) for x in leases],
            "resources": [tuple(r) for r in resources],
        }


def outcome_of(run_id: str) -> Outcome:
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        return Outcome(run.status, run.code, run.error, run.output)


def event_kinds(run_id: str) -> list[str]:
    with session_scope() as session:
        return list(session.scalars(sa.select(RunEvent.kind).where(RunEvent.run_id == run_id)
                                    .order_by(RunEvent.id)))


def is_current(fence: Fence) -> bool:
    """The fence's truth, read independently of hold(): current, active, unexpired, open run."""
    with session_scope() as session:
        return bool(session.scalar(
            sa.select(sa.func.count()).select_from(Attempt).join(Run, Run.id == Attempt.run_id)
            .where(Attempt.run_id == fence.run_id, Attempt.generation == fence.generation,
                   Attempt.lease_token == fence.lease_token, Attempt.state == AttemptState.ACTIVE,
                   Attempt.lease_expires_at > db_now(),
                   Run.current_generation == fence.generation,
                   Run.status.not_in(list(TERMINAL_STATUSES)))))


def wait_lease_expired(fence: Fence, timeout: float = 10.0) -> None:
    """Poll the database clock (never the local one) until the fence's lease has passed."""
    deadline = time.monotonic() + timeout
    while True:
        with session_scope() as session:
            passed = session.scalar(sa.select(Attempt.lease_expires_at < db_now()).where(
                Attempt.run_id == fence.run_id, Attempt.generation == fence.generation))
        if passed:
            return
        assert time.monotonic() < deadline, "the lease never expired by the database clock"
        time.sleep(0.02)


def supersede(run_id: str) -> None:
    """Test harness: abandon the current attempt so the next claim opens a new generation."""
    with session_scope() as session:
        session.execute(sa.update(Attempt).where(
            Attempt.run_id == run_id, Attempt.state == AttemptState.ACTIVE,
        ).values(state=AttemptState.FENCED_OUT, ended_at=db_now()))


def close_open_runs(org_prefix: str) -> None:
    """Runs a module drove by hand end cancelled, so no later reaper or sweep adopts them."""
    with session_scope() as session:
        open_ids = sa.select(Run.id).where(Run.status.not_in(list(TERMINAL_STATUSES)),
                                           Run.org_id.startswith(org_prefix))
        session.execute(sa.update(Attempt).where(
            Attempt.run_id.in_(open_ids),
            Attempt.state.in_([AttemptState.ACTIVE, AttemptState.DEFERRED]),
        ).values(state=AttemptState.ENDED, end_reason="test_cleanup", ended_at=db_now()))
        session.execute(sa.update(CapacityLease).where(
            CapacityLease.run_id.in_(open_ids), CapacityLease.state.in_(["reserved", "live"]),
        ).values(state="released", released_at=db_now()))
        # Their unsent starts too: the fair relay would publish them in a later test's time.
        session.execute(sa.update(Outbox).where(
            Outbox.run_id.in_(open_ids), Outbox.sent_at.is_(None)).values(sent_at=db_now()))
        session.execute(sa.update(Run).where(Run.id.in_(open_ids)).values(
            status="cancelled", code="CANCELLED", error="closed by the test harness",
            finished_at=db_now(), deferred_until=None))


def org_namer(prefix: str) -> Callable[[], str]:
    """A maker of fresh org ids under a module's prefix (close_open_runs finds them)."""
    return lambda: f"{prefix}{uuid.uuid4().hex[:8]}"


def closes_open_runs(prefix: str) -> Any:
    """A module-wide autouse fixture: the module's hand-driven runs end cancelled after it,
    so no later reaper or sweep adopts them."""
    @pytest.fixture(scope="module", autouse=True)
    def _no_open_runs_left(pg_url: str) -> Iterator[None]:
        yield
        close_open_runs(prefix)

    return _no_open_runs_left


def held(org_id: str) -> int:
    with session_scope() as session:
        return capacity.in_use(session, org_id)


def reserve(fence: Fence, org_id: str, settings: Settings | None = None) -> str:
    """A reservation in a transaction of its own (the statement checks the fence itself)."""
    with session_scope() as session:
        return capacity.reserve(session, fence, org_id, settings or get_settings()).lease_id


def promote(fence: Fence, lease_id: str, provider: str, sandbox_id: str) -> None:
    with session_scope() as session:
        capacity.promote(session, fence, lease_id, provider, sandbox_id)


def lease(lease_id: str) -> tuple[str, str | None, str | None]:
    with session_scope() as session:
        row = session.get(CapacityLease, lease_id)
        assert row is not None
        return row.state, row.provider, row.sandbox_id


def launched() -> tuple[LaunchFence, str]:
    """A claimed run whose sandbox is recorded live and its runner launched (no broker,
    no process): (its launch fence, its lease token)."""
    org = f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}"
    fence = must_claim(new_run(org), "t")
    sandbox = SandboxRef("fake", f"fsb-{uuid.uuid4().hex[:12]}", {"playrun": "1"}, time.time())
    mark = record_launch(fence, get_settings(), sandbox, reserve(fence, org))
    assert mark is not None
    return LaunchFence(fence.run_id, fence.generation, mark.launch_id), fence.lease_token
