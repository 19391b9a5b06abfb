"""Every terminal path of an attempt, run by a real worker with the fake provider, gives
back its capacity lease and deletes its sandbox, each recorded in the ledger."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import tasks
from models import CapacityLease, RuntimeResource
from tasks.acquisition import capacity
from tasks.constants import CAPACITY_EXCEEDED_MESSAGE, LABEL_RUN, SandboxState
from tasks.sandbox import FakeScript, SandboxProvider, get_provider
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tests.support.helpers import eventually, kinds
from tests.support.paths import HELLO, PLAYS
from tests.support.runs import FAST_STARTS, closes_open_runs, held, org_namer

ORG_PREFIX = "cap-"

org = org_namer(ORG_PREFIX)
_no_open_runs_left = closes_open_runs(ORG_PREFIX)


# --- every terminal path, with a real worker ------------------------------------------------

def _leftovers(run_id: str, prov: SandboxProvider) -> tuple[int, list[str], list[str]]:
    with session_scope() as session:
        holding = int(session.scalar(sa.select(sa.func.count()).where(
            CapacityLease.run_id == run_id, CapacityLease.state.in_(capacity.HELD))) or 0)
        undeleted = list(session.scalars(sa.select(RuntimeResource.sandbox_id).where(
            RuntimeResource.run_id == run_id, RuntimeResource.state != SandboxState.DELETED)))
    return holding, undeleted, [r.sandbox_id for r in prov.list({LABEL_RUN: run_id})]


def assert_nothing_left(run_id: str, provider_name: str, *, took_lease: bool,
                        made_sandbox: bool) -> None:
    prov = get_provider(provider_name, get_settings().sandbox_root)
    eventually(lambda: _leftovers(run_id, prov) == (0, [], []), timeout=30,
               what=f"run {run_id} to give everything back: {_leftovers(run_id, prov)}")
    with session_scope() as session:
        leases = list(session.scalars(sa.select(CapacityLease.id)
                                      .where(CapacityLease.run_id == run_id)))
        resources = list(session.scalars(sa.select(RuntimeResource.sandbox_id)
                                         .where(RuntimeResource.run_id == run_id)))
    events = tasks.run_events(run_id)
    released = sorted(e.data["lease_id"] for e in events if e.kind == "capacity.released")
    deleted = sorted(e.data["sandbox_id"] for e in events if e.kind == "sandbox.deleted")
    assert released == sorted(leases), (released, leases)
    assert deleted == sorted(resources), (deleted, resources)
    assert bool(leases) == took_lease, leases
    assert bool(resources) == made_sandbox, resources


@pytest.fixture(scope="class")
def fake_worker(pg_url: str) -> Iterator[Any]:
    from tests.support.stack import Worker, worker_env

    script = FakeScript(get_settings().sandbox_root)
    script.reset()
    w = Worker(worker_env(PLAYRUN_SANDBOX_PROVIDER="fake", PLAYRUN_DEFERRAL_MAX_COUNT="2",
                          PLAYRUN_DEFERRAL_BASE_MS="50", PLAYRUN_DEFERRAL_MAX_MS="100",
                          **FAST_STARTS), concurrency=4)
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()
        script.reset()


@pytest.mark.slow
@pytest.mark.usefixtures("fake_worker")
class TestEveryTerminalPathGivesEverythingBack:
    def test_succeeded(self) -> None:
        run = tasks.submit_run(HELLO, input={"name": "Ada"}, org_id=org())
        assert run.wait(timeout=60).status == "succeeded"
        assert_nothing_left(run.id, "fake", took_lease=True, made_sandbox=True)

    def test_failed_in_customer_code(self) -> None:
        run = tasks.submit_run(PLAYS / "raises.py", input={}, org_id=org())
        result = run.wait(timeout=60)
        assert (result.status, result.code) == ("failed", "PLAY_ERROR")
        assert "the customer code broke" in (result.error or "")
        assert_nothing_left(run.id, "fake", took_lease=True, made_sandbox=True)

    def test_cancelled(self) -> None:
        run = tasks.submit_run(PLAYS / "forever.py", input={}, org_id=org())
        eventually(lambda: any(e.kind == "run.progress" and e.data["message"] == "looping"
                               for e in tasks.run_events(run.id)), what="the play to loop")
        tasks.cancel_run(run.id)
        result = run.wait(timeout=60)
        assert (result.status, result.code) == ("cancelled", "CANCELLED")
        assert_nothing_left(run.id, "fake", took_lease=True, made_sandbox=True)

    def test_capacity_rejection(self) -> None:
        org_id = org()
        capacity.set_limit(org_id, 0)
        run = tasks.submit_run(HELLO, input={"name": "Bo"}, org_id=org_id)
        result = run.wait(timeout=60)
        assert (result.status, result.code) == ("failed", "SANDBOX_CAPACITY_EXCEEDED")
        assert CAPACITY_EXCEEDED_MESSAGE in (result.error or "")
        assert "sandbox.requested" not in kinds(run.id)
        assert_nothing_left(run.id, "fake", took_lease=False, made_sandbox=False)

    def test_runner_lost(self) -> None:
        script = FakeScript(get_settings().sandbox_root)
        lost_before = script.state()["runners_lost"]
        script.set(lose_runner=1)
        try:
            run = tasks.submit_run(HELLO, input={"name": "Cy"}, org_id=org())
            result = run.wait(timeout=60)
        finally:
            script.set()
        assert (result.status, result.code) == ("failed", "RUNTIME_RUNNER_LOST")
        assert script.state()["runners_lost"] == lost_before + 1
        assert_nothing_left(run.id, "fake", took_lease=True, made_sandbox=True)

    def test_pre_code_failure(self) -> None:
        script = FakeScript(get_settings().sandbox_root)
        script.set(fail_creates=["auth"])
        try:
            run = tasks.submit_run(HELLO, input={"name": "Di"}, org_id=org())
            result = run.wait(timeout=60)
        finally:
            script.set()
        assert (result.status, result.code) == ("failed", "SANDBOX_START_FAILED")
        assert "sandbox.requested" in kinds(run.id)
        assert_nothing_left(run.id, "fake", took_lease=True, made_sandbox=False)

    def test_deferral_budget_exhausted(self) -> None:
        """Three transport failures at create: deferred twice (each time giving the lease
        back), then the budget (2 deferrals in this worker) is spent: a terminal failure."""
        script = FakeScript(get_settings().sandbox_root)
        script.set(fail_creates=["transport"] * 3)
        try:
            run = tasks.submit_run(HELLO, input={"name": "Eve"}, org_id=org())
            result = run.wait(timeout=60)
        finally:
            script.set()
        assert (result.status, result.code) == ("failed", "START_DEFERRAL_EXHAUSTED")
        assert "transport" in (result.error or "")
        assert kinds(run.id).count("run.deferred") == 2
        assert_nothing_left(run.id, "fake", took_lease=True, made_sandbox=False)
        with session_scope() as session:
            assert session.scalar(sa.select(sa.func.count()).where(
                CapacityLease.run_id == run.id)) == 3

    def test_a_full_org_does_not_block_another(self) -> None:
        a, b = org(), org()
        capacity.set_limit(a, 1)
        capacity.set_limit(b, 1)
        holder = tasks.submit_run(PLAYS / "forever.py", input={}, org_id=a)
        eventually(lambda: "sandbox.live" in kinds(holder.id), what="org A's slot to be live")
        refused = tasks.submit_run(HELLO, input={"name": "Ed"}, org_id=a).wait(timeout=60)
        assert refused.code == "SANDBOX_CAPACITY_EXCEEDED"
        other = tasks.submit_run(HELLO, input={"name": "Flo"}, org_id=b)
        assert other.wait(timeout=60).status == "succeeded"
        tasks.cancel_run(holder.id)
        assert holder.wait(timeout=60).status == "cancelled"
        assert_nothing_left(holder.id, "fake", took_lease=True, made_sandbox=True)
        assert_nothing_left(other.id, "fake", took_lease=True, made_sandbox=True)
        assert (held(a), held(b)) == (0, 0)


@pytest.mark.slow
def test_observe_mode_runs_over_the_limit_and_records_the_overrun(pg_url: str) -> None:
    from tests.support.stack import Worker, worker_env

    org_id = org()
    capacity.set_limit(org_id, 0)
    w = Worker(worker_env(PLAYRUN_CAPACITY_MODE="observe", **FAST_STARTS))
    try:
        w.wait_ready()
        run = tasks.submit_run(HELLO, input={"name": "Gus"}, org_id=org_id)
        result = run.wait(timeout=60)
        assert result.status == "succeeded", (result, w.output()[-2000:])
        assert_nothing_left(run.id, "local", took_lease=True, made_sandbox=True)
    finally:
        w.stop()
    overrun = [e.data for e in tasks.run_events(run.id) if e.kind == "capacity.overrun"]
    assert len(overrun) == 1 and overrun[0]["limit"] == 0 and overrun[0]["in_use"] == 0


