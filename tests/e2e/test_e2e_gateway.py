"""Runners that push through a real gateway process: restarts, lost runners, cancels,
floods of progress and hostile result documents, and two hosts' sandboxes."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import pytest

import tasks
from tests.support.helpers import eventually, kinds
from tests.support.paths import PLAYS
from tests.support.stack import Gateway, Worker, worker_env

pytestmark = pytest.mark.slow


def org() -> str:
    return f"gw-{uuid.uuid4().hex[:8]}"


def released(run_id: str) -> bool:
    found = kinds(run_id)
    return "capacity.released" in found and "sandbox.deleted" in found


def test_a_run_pushes_progress_and_its_terminal(worker: Worker) -> None:
    handle = tasks.submit_run(PLAYS / "sleepy.py", input={"seconds": 1.5}, org_id=org())
    eventually(lambda: tasks.get_run(handle.id).attempts
               and tasks.get_run(handle.id).attempts[0].heartbeat_deadline, what="a launch")
    result = handle.wait(timeout=60)
    assert (result.status, result.output) == ("succeeded", {"slept": 1.5})
    assert [e.data["message"] for e in tasks.run_events(handle.id)
            if e.kind == "run.progress"] == ["sleeping", "awake"]
    eventually(lambda: released(handle.id), what="the release")


def test_the_gateway_restarting_while_runs_finish_loses_nothing(
        worker: Worker, gateway: Gateway) -> None:
    handles = [tasks.submit_run(PLAYS / "sleepy.py", input={"seconds": 2}, org_id=org())
               for _ in range(10)]
    eventually(lambda: all("run.progress" in kinds(h.id) for h in handles), timeout=60,
               what="all ten running")
    gateway.stop(9)
    try:
        # The plays end while it is down: their results wait in the sandboxes, and the
        # reaper's inspection or the runners' retried pushes settle them.
        results = [h.wait(timeout=90) for h in handles]
    finally:
        gateway.start()
    assert [(r.status, r.output) for r in results] == [("succeeded", {"slept": 2.0})] * 10
    for h in handles:
        assert kinds(h.id).count("run.succeeded") == 1
        assert "RUNTIME_RUNNER_LOST" not in str(tasks.get_run(h.id).code)


def test_a_runner_killed_mid_play_is_reported_lost(worker: Worker) -> None:
    handle = tasks.submit_run(PLAYS / "killed.py", input={}, org_id=org())
    result = handle.wait(timeout=60)
    assert (result.status, result.code) == ("failed", "RUNTIME_RUNNER_LOST")
    lost = [e.data for e in tasks.run_events(handle.id) if e.kind == "runner.lost"]
    # Its supervisor reported the exit: no heartbeat timeout was waited for.
    assert lost and "killed by signal 9" in lost[0]["reason"]
    assert "heartbeats stopped" not in lost[0]["reason"]
    eventually(lambda: released(handle.id), what="the release")


def test_cancel_deletes_the_sandbox_then_ends_cancelled(worker: Worker) -> None:
    handle = tasks.submit_run(PLAYS / "forever.py", input={}, org_id=org())
    eventually(lambda: "run.progress" in kinds(handle.id), what="the play to start")
    tasks.cancel_run(handle.id)
    result = handle.wait(timeout=60)
    assert (result.status, result.code) == ("cancelled", "CANCELLED")
    found = kinds(handle.id)
    assert found.index("sandbox.deleted") < found.index("run.cancelled")


def test_a_flood_of_progress_is_kept_to_its_budget_and_counted(worker: Worker) -> None:
    handle = tasks.submit_run(PLAYS / "flood.py", input={"lines": 30_000}, org_id=org())
    assert handle.wait(timeout=120).status == "succeeded"
    events = tasks.run_events(handle.id)  # pages of at most 10,000: read them all
    while len(page := tasks.run_events(handle.id, after=events[-1].seq)) > 0:
        events += page
    kept = [e for e in events if e.kind == "run.progress"]
    dropped = [e.data for e in events if e.kind == "run.progress_dropped"]
    assert len(kept) == 10_000
    assert dropped == [{"dropped": 20_000, "kept": 10_000}]


@pytest.mark.parametrize("shape", ["deep", "huge_number"])
def test_a_hostile_result_file_is_output_invalid_and_frees_the_slot(
        worker: Worker, shape: str) -> None:
    who = org()
    handle = tasks.submit_run(PLAYS / "leave_result.py", input={"shape": shape}, org_id=who)
    result = handle.wait(timeout=60)
    assert (result.status, result.code) == ("failed", "OUTPUT_INVALID")
    eventually(lambda: released(handle.id), what="the release")
    after = tasks.submit_run(PLAYS / "leave_result.py", input={"shape": "fine"}, org_id=who)
    assert after.wait(timeout=60).output == {"fine": True}  # the worker serves the next


def test_two_hosts_each_keep_their_own_sandboxes(pg_url: str, gateway: Gateway) -> None:
    hosts, roots = [], []
    for _ in range(2):
        root = tempfile.mkdtemp(prefix="playrun-host-")
        roots.append(Path(root))
        hosts.append(Worker(worker_env(PLAYRUN_SANDBOX_ROOT=root, PLAYRUN_REAP_INTERVAL_S="1"),
                            beat=True))
    try:
        for h in hosts:
            h.wait_ready()
        handles = [tasks.submit_run(PLAYS / "sleepy.py", input={"seconds": 3}, org_id=org())
                   for _ in range(16)]
        results = [h.wait(timeout=120) for h in handles]
        assert [r.status for r in results] == ["succeeded"] * 16, [r.error for r in results]
        for h in handles:
            eventually(lambda h=h: released(h.id), what="the release on its own host")
        # Every sandbox was deleted by the host that made it: no directory is left behind.
        for root in roots:
            eventually(lambda root=root: not list(root.glob("lsb-*")), what="empty roots")
    finally:
        for h in hosts:
            h.stop()


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_play_that_deletes_its_own_sandbox_leaves_nothing_running(worker: Worker) -> None:
    who, marker = org(), f"playrun-vanish-{uuid.uuid4().hex}"
    handle = tasks.submit_run(PLAYS / "vanish.py", input={"marker": marker}, org_id=who)
    result = handle.wait(timeout=90)
    assert result.status in {"succeeded", "failed"}  # settled, whatever it managed to say
    eventually(lambda: released(handle.id), what="the release")
    eventually(lambda: not _processes_with(marker), what="its child killed")
    after = tasks.submit_run(PLAYS / "sleepy.py", input={"seconds": 0.1}, org_id=who)
    assert after.wait(timeout=60).status == "succeeded"  # the worker serves the next
