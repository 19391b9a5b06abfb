"""Work receipts end to end: plays calling ctx.step in local sandboxes, real workers (with
beat), the real gateway and PostgreSQL. What a user sees: run outcomes, the ledger, the
receipts, and a counter file the step's fn appends to each time it really runs."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import tasks
from models import Attempt, Run, WorkReceipt, db_now
from tasks.acquisition import capacity
from tasks.store.db import session_scope
from tests.support.helpers import eventually, kinds
from tests.support.paths import PLAYS
from tests.support.runs import FAST_STARTS, HOST_FILES, close_open_runs, supersede
from tests.support.stack import Worker, worker_env

pytestmark = pytest.mark.slow
ORG_PREFIX = "rce-"
STEPS = PLAYS / "steps.py"


@pytest.fixture(scope="module")
def steps_worker(pg_url: str) -> Iterator[Worker]:
    # Process isolation: the side-effect counter is a file on the host.
    w = Worker(worker_env(PLAYRUN_REAP_INTERVAL_S="1", **FAST_STARTS, **HOST_FILES), beat=True,
               concurrency=4)
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()
        close_open_runs(ORG_PREFIX)


def org() -> str:
    return f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}"


def calls(counter: Path) -> int:
    return counter.read_text().count("\n") if counter.exists() else 0


def submit(org_id: str, counter: Path, play: Path = STEPS, **input: Any) -> tasks.RunHandle:
    return tasks.submit_run(play, input={"counter": str(counter), **input}, org_id=org_id)


def events(run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in tasks.run_events(run_id) if e.kind == kind]


def receipt(org_id: str, key: str = "lookup:acme.com") -> tasks.ReceiptView | None:
    found = [r for r in tasks.receipts(org_id) if r.key == key]
    return found[0] if found else None


def status_of(org_id: str, key: str = "lookup:acme.com") -> str | None:
    found = receipt(org_id, key)
    return found.status if found else None


def test_a_completed_step_is_not_paid_for_twice_across_runs(steps_worker: Worker,
                                                             tmp_path: Path) -> None:
    org_id, counter = org(), tmp_path / "calls.txt"
    first = submit(org_id, counter, tag="first")
    assert first.wait(timeout=60).output == {"out": {"tag": "first"}}
    second = submit(org_id, counter, tag="second")
    result = second.wait(timeout=60)
    assert result.status == "succeeded", result.error
    assert result.output == {"out": {"tag": "first"}}
    assert calls(counter) == 1
    assert events(first.id, "step.completed") == [{"key": "lookup:acme.com"}]
    assert events(second.id, "step.reused") == [{"key": "lookup:acme.com", "count": 1,
                                                 "computed_by": first.id}]
    view = receipt(org_id)
    assert view is not None
    assert (view.status, view.run_id, view.play, view.claims) == ("completed", first.id,
                                                                  "steps", 1)


def test_receipts_are_isolated_between_orgs_and_plays(steps_worker: Worker,
                                                      tmp_path: Path) -> None:
    org_id, counter = org(), tmp_path / "calls.txt"
    enrich = tmp_path / "enrich.py"  # the same code under another play name
    shutil.copy(STEPS, enrich)
    assert submit(org_id, counter, tag="a").wait(timeout=60).status == "succeeded"
    other_org = submit(org(), counter, tag="b").wait(timeout=60)
    other_play = submit(org_id, counter, play=enrich, tag="c").wait(timeout=60)
    again = submit(org_id, counter, tag="d").wait(timeout=60)
    assert [r.output["out"]["tag"] for r in (other_org, other_play, again)] == ["b", "c", "a"]
    assert calls(counter) == 3
    assert sorted(r.play for r in tasks.receipts(org_id)) == ["enrich", "steps"]


def test_a_ttl_receipt_is_computed_again_once_it_expires(steps_worker: Worker,
                                                         tmp_path: Path) -> None:
    org_id, counter = org(), tmp_path / "calls.txt"
    assert submit(org_id, counter, tag="a", ttl=1).wait(timeout=60).status == "succeeded"

    def expired() -> bool:
        with session_scope() as s:
            return bool(s.scalar(sa.select(WorkReceipt.expires_at < db_now()).where(
                WorkReceipt.org_id == org_id)))

    eventually(expired, timeout=10, what="the receipt to expire by the database clock")
    assert submit(org_id, counter, tag="b").wait(timeout=60).output["out"]["tag"] == "b"
    assert calls(counter) == 2


@pytest.mark.parametrize(("input", "code", "ran"), [
    ({"mode": "once", "key": ""}, "STEP_KEY_INVALID", 0),
    ({"mode": "long_key", "length": 100_000}, "STEP_KEY_INVALID", 0),
    ({"mode": "set"}, "OUTPUT_INVALID", 0),
    ({"mode": "big"}, "OUTPUT_INVALID", 0),
    ({"mode": "recursive"}, "STEP_RECURSIVE", 0),
    ({"mode": "raises"}, "PLAY_ERROR", 1),
])
def test_a_bad_step_fails_the_run_with_a_clear_code_and_a_later_run_may_retry(
        steps_worker: Worker, tmp_path: Path, input: dict[str, Any], code: str,
        ran: int) -> None:
    org_id, counter = org(), tmp_path / "calls.txt"
    result = submit(org_id, counter, **input).wait(timeout=60)
    assert (result.status, result.code) == ("failed", code), result.error
    if code != "PLAY_ERROR":
        assert f"StepError: {code}" in (result.error or "")
    assert calls(counter) == ran
    if input.get("key") != "" and input["mode"] != "long_key":
        # The step got as far as its receipt: it is failed, and the ledger says so.
        view = receipt(org_id)
        assert view is not None and (view.status, view.code) == ("failed", code)
        assert [e["code"] for e in events(result_run(org_id), "step.failed")] == [code]
        retry = submit(org_id, counter, tag="retry").wait(timeout=60)
        assert retry.output == {"out": {"tag": "retry"}}
        assert status_of(org_id) == "completed"
    else:
        assert tasks.receipts(org_id) == []


def result_run(org_id: str) -> str:
    (run,) = tasks.list_runs(limit=5, org_id=org_id)
    return run.id


def test_twenty_runs_claiming_one_key_at_once_pay_for_it_once(steps_worker: Worker,
                                                               tmp_path: Path) -> None:
    org_id, counter, gate = org(), tmp_path / "calls.txt", tmp_path / "gate"
    capacity.set_limit(org_id, 50)
    handles = [submit(org_id, counter, tag=f"r{i}", gate=str(gate)) for i in range(20)]
    # Every run has reached its ctx.step before the one that holds it may finish.
    eventually(lambda: all("run.progress" in kinds(h.id) for h in handles), timeout=120,
               every=0.2, what="all twenty runs to reach their step")
    eventually(lambda: calls(counter) == 1, what="one run to be in the step's fn")
    gate.touch()
    results = [h.wait(timeout=120) for h in handles]
    assert {r.status for r in results} == {"succeeded"}, [r.error for r in results]
    outputs = {r.output["out"]["tag"] for r in results}
    assert len(outputs) == 1 and calls(counter) == 1
    (computed,) = [h.id for h in handles if events(h.id, "step.completed")]
    assert outputs == {f"r{[h.id for h in handles].index(computed)}"}
    reused = [e for h in handles for e in events(h.id, "step.reused")]
    assert len(reused) == 19 and {e["computed_by"] for e in reused} == {computed}
    assert not any(events(h.id, "step.taken_over") for h in handles)


def test_a_runner_killed_during_a_step_releases_it_and_the_next_run_completes_it(
        steps_worker: Worker, tmp_path: Path) -> None:
    org_id, counter = org(), tmp_path / "calls.txt"
    killed = submit(org_id, counter, mode="kill").wait(timeout=60)
    assert (killed.status, killed.code) == ("failed", "RUNTIME_RUNNER_LOST")
    eventually(lambda: status_of(org_id) == "released", what="the receipt's release")
    run_id = result_run(org_id)
    assert events(run_id, "receipts.released") == [{"count": 1}]
    assert kinds(run_id).index("run.failed") < kinds(run_id).index("receipts.released")
    after = submit(org_id, counter, tag="after").wait(timeout=60)
    assert after.output == {"out": {"tag": "after"}}
    view = receipt(org_id)
    assert view is not None and (view.status, view.claims) == ("completed", 2)
    assert calls(counter) == 2


# --- every terminal path releases what the attempt still holds ------------------------------

def hold(org_id: str, counter: Path, then: str) -> tasks.RunHandle:
    handle = submit(org_id, counter, mode="hold", then=then)
    if then == "loop":
        eventually(lambda: "run.progress" in kinds(handle.id), timeout=60,
                   what="the play to hold its step")
        assert status_of(org_id) == "running"
    return handle


def assert_released(org_id: str, run_id: str) -> None:
    eventually(lambda: status_of(org_id) == "released", timeout=60,
               what=f"the receipt's release (it is {status_of(org_id)})")
    eventually(lambda: events(run_id, "receipts.released"), what="the ledger event")
    assert events(run_id, "receipts.released") == [{"count": 1}]


@pytest.mark.usefixtures("steps_worker")
class TestEveryTerminalPathReleasesHeldReceipts:
    def test_succeeded(self, tmp_path: Path) -> None:
        org_id = org()
        handle = hold(org_id, tmp_path / "c", "return")
        assert handle.wait(timeout=60).output == {"held": True}
        assert_released(org_id, handle.id)

    def test_failed(self, tmp_path: Path) -> None:
        org_id = org()
        handle = hold(org_id, tmp_path / "c", "raise")
        assert handle.wait(timeout=60).code == "PLAY_ERROR"
        assert_released(org_id, handle.id)

    def test_cancelled(self, tmp_path: Path) -> None:
        org_id = org()
        handle = hold(org_id, tmp_path / "c", "loop")
        tasks.cancel_run(handle.id)
        assert handle.wait(timeout=60).status == "cancelled"
        assert_released(org_id, handle.id)

    def test_fence_lost(self, tmp_path: Path) -> None:
        """The attempt is fenced out under its runner: the runner stops at its next
        heartbeat, and the reaper releases what the dead attempt held."""
        org_id = org()
        handle = hold(org_id, tmp_path / "c", "loop")
        supersede(handle.id)
        assert_released(org_id, handle.id)
        eventually(lambda: "sandbox.deleted" in kinds(handle.id), what="the sandbox's end")
        assert tasks.get_run(handle.id).status == "running"  # nobody settled it: no owner

    def test_runner_lost(self, tmp_path: Path) -> None:
        org_id = org()
        handle = submit(org_id, tmp_path / "c", mode="kill")
        assert handle.wait(timeout=60).code == "RUNTIME_RUNNER_LOST"
        assert_released(org_id, handle.id)

    def test_reaped(self, tmp_path: Path) -> None:
        """A frozen runner past its deadline that no inspection settled: the reaper's
        backstop fails the run, and its release frees the receipt."""
        org_id, counter = org(), tmp_path / "c"
        handle = submit(org_id, counter, mode="stop")
        eventually(lambda: status_of(org_id) == "running" and calls(counter) == 1,
                   timeout=60, what="the step to start")
        with session_scope() as s:
            s.execute(sa.update(Attempt).where(Attempt.run_id == handle.id).values(
                runner_deadline=db_now(-3600), lease_expires_at=db_now(-1)))
        result = handle.wait(timeout=60)
        assert (result.status, result.code) == ("failed", "RUNTIME_RUNNER_LOST")
        assert "could not be inspected" in (result.error or "")
        assert_released(org_id, handle.id)
        with session_scope() as s:
            assert s.scalar(sa.select(Run.status).where(Run.id == handle.id)) == "failed"
