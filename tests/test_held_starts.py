"""A worker killed while it holds start messages (a deferral's countdown) re-sends them
when it starts again under the same name, instead of leaving them to the broker's
one-hour visibility timeout or the outbox sweep's backoff."""

from __future__ import annotations

import signal
import uuid

import pytest
import redis

import tasks
from tasks.acquisition import policy
from tasks.maintenance.held import held_runs, note_done, note_held, take_held
from tests.conftest import ROOT, TEST_REDIS_URL, Worker, worker_env
from tests.helpers import eventually
from tests.support import FAST_RECOVERY

pytestmark = pytest.mark.slow
NOOP = ROOT / "examples" / "plays" / "noop.py"


def test_held_sets_are_per_node_and_taken_once() -> None:
    client = redis.Redis.from_url(TEST_REDIS_URL)
    node = f"n{uuid.uuid4().hex[:6]}@test"
    note_held(client, node, "t1", "r1")
    note_held(client, node, "t2", "r2")
    note_held(client, node, "t3", "r1")  # r1's next start, received before t1 returned
    note_held(client, "other@" + node, "t9", "r9")
    note_done(client, node, "t1")
    note_done(client, node, "t2")
    assert take_held(client, node) == ["r1"]
    assert take_held(client, node) == []
    assert take_held(client, "other@" + node) == ["r9"]


def test_a_restarted_worker_resends_the_starts_it_held(pg_url: str) -> None:
    client = redis.Redis.from_url(TEST_REDIS_URL)
    name = f"held{uuid.uuid4().hex[:6]}@test"
    # Only the held-set re-send can bring the run back in time: the sweep waits 10 minutes.
    env = worker_env(**FAST_RECOVERY, PLAYRUN_OUTBOX_RESEND_AFTER_S="600",
                     PLAYRUN_DEFERRAL_BASE_MS="6000")
    first = Worker(env, name=name, beat=True)
    try:
        first.wait_ready()
        policy.set_policy(policy.HOLD, for_s=3)  # once the worker is up: its start is slow
        handle = tasks.submit_run(NOOP, input={}, org_id=f"org-{uuid.uuid4().hex[:6]}")
        eventually(lambda: any(e.kind == "run.deferred" for e in tasks.run_events(handle.id)),
                   what="the hold to defer the run")
        # The deferral's countdown message is now held by this worker (an ETA task).
        eventually(lambda: handle.id in held_runs(client, name),
                   what="the worker to hold the deferred start")
    finally:
        first.stop(signal.SIGKILL)
    second = Worker(env, name=name, beat=True)
    try:
        second.wait_ready()
        result = handle.wait(timeout=45)
    finally:
        second.stop()
        policy.set_policy(policy.NORMAL, for_s=None)
    assert result.status == "succeeded", result
    assert "re-sent 1 start(s)" in second.output()
    assert handle.id not in held_runs(client, name)
