"""The `fake` provider's hosted runners: one process speaks the real gateway protocol
for hundreds of detached runs, which one worker starts and then forgets."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import tasks
from tasks.acquisition import capacity
from tasks.sandbox import FakeScript
from tests.support.helpers import eventually, kinds
from tests.support.paths import NOOP, ROOT
from tests.support.runs import FAST_STARTS
from tests.support.stack import Gateway, Worker, worker_env

pytestmark = pytest.mark.slow


@pytest.fixture
def hosted(pg_url: str, gateway: Gateway) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="playrun-fake-"))
    FakeScript(root).set(hosted_runners=True)
    env = worker_env(PLAYRUN_SANDBOX_PROVIDER="fake", PLAYRUN_SANDBOX_ROOT=str(root),
                     **FAST_STARTS)
    log = open(root / "host.log", "wb")  # noqa: SIM115 - closed below
    host = subprocess.Popen([sys.executable, "-m", "tasks.sandbox.fake_runners", str(root)],
                            env=env, cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT)
    worker = Worker(env, concurrency=2)
    try:
        worker.wait_ready()
        eventually(lambda: b"ready" in (root / "host.log").read_bytes(), what="the host")
        yield root
    finally:
        worker.stop()
        host.terminate()
        host.wait(timeout=10)
        log.close()


def test_hundreds_of_detached_runs_on_one_worker(hosted: Path) -> None:
    org = f"fake-{uuid.uuid4().hex[:8]}"
    capacity.set_limit(org, 500)
    n = 60
    handles = [tasks.submit_run(NOOP, input={"fake": {"seconds": 45, "progress": 2,
                                                      "output": {"i": i}}}, org_id=org)
               for i in range(n)]
    # All of them are running at once, on a worker with two slots.
    eventually(lambda: all(tasks.get_run(h.id).status == "running" for h in handles),
               timeout=40, what="all of them running together")
    results = [h.wait(timeout=120) for h in handles]
    assert [(r.status, r.output) for r in results] == [
        ("succeeded", {"i": i}) for i in range(n)]
    assert [e.data["message"] for e in tasks.run_events(handles[0].id)
            if e.kind == "run.progress"] == ["fake progress"] * 2


def test_a_hosted_runner_that_never_ends_is_cancelled(hosted: Path) -> None:
    handle = tasks.submit_run(NOOP, input={"fake": {"hang": True}},
                              org_id=f"fake-{uuid.uuid4().hex[:8]}")
    eventually(lambda: tasks.get_run(handle.id).status == "running", what="a start")
    tasks.cancel_run(handle.id)  # its host deletes the sandbox, then writes cancelled
    assert handle.wait(timeout=60).status == "cancelled"
    assert "sandbox.deleted" in kinds(handle.id)
