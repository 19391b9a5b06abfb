"""`PLAYRUN_CAPACITY_FULL=defer`: a full org waits through the bounded deferral instead
of failing, and runs once a slot is free."""

from __future__ import annotations

import uuid

import pytest

import tasks
from tasks.acquisition import capacity
from tests.conftest import PLAYS, ROOT, Worker, worker_env
from tests.helpers import eventually

pytestmark = pytest.mark.slow


def test_a_full_org_defers_and_then_runs(pg_url: str) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"
    capacity.set_limit(org, 1)
    w = Worker(worker_env(PLAYRUN_CAPACITY_FULL="defer", PLAYRUN_DEFERRAL_BASE_MS="200",
                          PLAYRUN_DEFERRAL_MAX_MS="500", PLAYRUN_SWEEP_INTERVAL_S="0.5"),
               beat=True)
    try:
        w.wait_ready()
        long = tasks.submit_run(PLAYS / "sleepy.py", input={"seconds": 2}, org_id=org)
        eventually(lambda: tasks.get_run(long.id).sandbox_id, what="the first sandbox")
        second = tasks.submit_run(ROOT / "examples" / "plays" / "noop.py", input={}, org_id=org)
        assert long.wait(timeout=60).status == "succeeded"
        assert second.wait(timeout=60).status == "succeeded"
    finally:
        w.stop()
    causes = [e.data["cause"] for e in tasks.run_events(second.id) if e.kind == "run.deferred"]
    assert causes and set(causes) == {"capacity"}
