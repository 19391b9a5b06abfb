"""A worker killed while it holds start messages (a deferral's countdown) re-sends them
when it starts again under the same name, instead of leaving them to the broker's
one-hour visibility timeout or the outbox sweep's backoff."""

from __future__ import annotations

import signal
import uuid

import pytest
import redis
import sqlalchemy as sa

import tasks
from models import Attempt, db_now
from tasks.acquisition import policy
from tasks.acquisition.claim import Claimed, claim
from tasks.maintenance.held import held_runs, note_done, note_held, take_held
from tasks.store.db import session_scope
from tests.support.helpers import eventually
from tests.support.paths import ROOT
from tests.support.runs import FAST_RECOVERY
from tests.support.session import TEST_REDIS_URL
from tests.support.stack import Worker, worker_env

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
    # FIFO order: in fair order a deferred start waits in the outbox, never held by a worker.
    env = worker_env(**FAST_RECOVERY, PLAYRUN_OUTBOX_RESEND_AFTER_S="600",
                     PLAYRUN_DEFERRAL_BASE_MS="6000", PLAYRUN_START_ORDER="fifo")
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
        assert result.status == "succeeded", result
        # Each start of the run it holds is cleared as its task ends (after the run's
        # terminal, maybe: the broker may hand back the killed worker's copy too).
        eventually(lambda: handle.id not in held_runs(client, name), timeout=30,
                   what="the held starts cleared")
    finally:
        second.stop()
        policy.set_policy(policy.NORMAL, for_s=None)
    assert "re-sent 1 start(s)" in second.output()


def _claim_as(run_id: str, worker: str) -> None:
    with session_scope() as session:
        assert isinstance(claim(session, run_id, worker_id=worker, lease_seconds=600), Claimed)


def test_a_restarted_worker_ends_the_leases_its_last_life_claimed(pg_url: str) -> None:
    """A previous life of this node claimed a run and died before launching it: its 10-minute
    lease is ended when the node starts again, and the run is retried within seconds.
    Another node's claim is left alone."""
    name = f"back{uuid.uuid4().hex[:6]}@test"
    org = f"org-{uuid.uuid4().hex[:6]}"
    mine = tasks.submit_run(NOOP, input={}, org_id=org)
    theirs = tasks.submit_run(NOOP, input={}, org_id=org)
    _claim_as(mine.id, f"{name}:4242")  # its last life, now gone
    _claim_as(theirs.id, f"other{name}:4242")  # a node name that merely ends the same
    worker = Worker(worker_env(**FAST_RECOVERY), name=name, beat=True)
    try:
        worker.wait_ready()
        result = mine.wait(timeout=45)
    finally:
        worker.stop()
    assert result.status == "succeeded", result
    assert "ended the leases of 1 attempt(s)" in worker.output()
    deferred = [e.data for e in tasks.run_events(mine.id) if e.kind == "run.deferred"]
    assert [d["cause"] for d in deferred] == ["worker_lost"]
    assert [a.generation for a in tasks.get_run(mine.id).attempts] == [1]
    with session_scope(readonly=True) as session:
        other = session.execute(sa.select(Attempt.worker_id, Attempt.lease_expires_at > db_now())
                                .where(Attempt.run_id == theirs.id)).one()
    assert other == (f"other{name}:4242", True)
    assert tasks.get_run(theirs.id).status == "running"


def test_a_restarted_worker_hands_on_a_launch_whose_runner_never_started(pg_url: str) -> None:
    """Its last life recorded a launch and died before exec: nothing ever ran in the
    sandbox. Rather than wait out the first heartbeat deadline (40 s here), the node
    hands it to the reaper when it starts again, and the run succeeds in seconds."""
    from tasks.acquisition.sandbox import create
    from tasks.execution.launch import record_launch
    from tasks.sandbox.runtime import provider
    from tasks.settings import get_settings

    name = f"exec{uuid.uuid4().hex[:6]}@test"
    run = tasks.submit_run(NOOP, input={}, org_id=f"org-{uuid.uuid4().hex[:6]}")
    with session_scope() as session:
        claimed = claim(session, run.id, worker_id=f"{name}:4242", lease_seconds=600)
    assert isinstance(claimed, Claimed)
    settings = get_settings().model_copy(update={"heartbeat_timeout_s": 30.0})
    ref = create(provider(), claimed, settings, None)
    assert record_launch(claimed.fence, settings, ref, None) is not None  # then "killed"
    worker = Worker(worker_env(**FAST_RECOVERY), name=name, beat=True)
    try:
        worker.wait_ready()
        result = run.wait(timeout=25)  # well inside the 40 s first-heartbeat lease
    finally:
        worker.stop()
    assert result.status == "succeeded", result
    assert "launched but never started" in worker.output()
    deferred = [e.data for e in tasks.run_events(run.id) if e.kind == "run.deferred"]
    assert [(d["cause"], d["detail"]) for d in deferred] == \
        [("worker_lost", "the runner was never started")]
    assert [a.generation for a in tasks.get_run(run.id).attempts] == [1]
