"""Crash recovery with real workers: SIGKILL mid-run, a worker lost before launch,
and a worker refusing an unmigrated database."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

import tasks
from models import Attempt, db_now
from tasks.acquisition.claim import Claimed, claim
from tasks.acquisition.start import Opened, Step, acquire_sandbox, open_attempt
from tasks.constants import KEY_START_RATE
from tasks.execution.launch import record_launch
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tests.support.helpers import eventually, kinds
from tests.support.paths import PLAYS, ROOT
from tests.support.runs import FAST_RECOVERY, HOST_FILES
from tests.support.session import pg_database, psql
from tests.support.stack import Worker, worker_env

pytestmark = pytest.mark.slow


def test_worker_killed_mid_run_is_recovered_and_the_play_runs_once(
    pg_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran.txt"
    first = Worker(worker_env(**FAST_RECOVERY, **HOST_FILES), beat=True)
    first.wait_ready()
    handle = tasks.submit_run(PLAYS / "counter.py", input={"path": str(marker), "seconds": 4},
                              org_id=f"org-{uuid.uuid4().hex[:6]}")
    eventually(lambda: marker.exists(), what="the play to start")
    first.stop(signal.SIGKILL)  # the whole worker: main process and pool children
    second = Worker(worker_env(**FAST_RECOVERY, **HOST_FILES), beat=True)
    try:
        second.wait_ready()
        result = handle.wait(timeout=60)
        eventually(lambda: "capacity.released" in kinds(handle.id), what=f"release "
                   f"{kinds(handle.id)} {second.output()[-3000:]}")
    finally:
        second.stop()
    assert result.status == "succeeded", result
    assert result.output == {"ok": True}
    assert marker.read_text().count("\n") == 1, "the play ran more than once"
    view = tasks.get_run(handle.id)
    assert [a.generation for a in view.attempts] == [1]


def test_an_attempt_lost_before_launch_is_deferred_and_then_completes(pg_url: str) -> None:
    """A worker that died between claim and launch: no customer code ran, so the reaper
    defers the start (same generation) and a worker finishes the run."""
    handle = tasks.submit_run(ROOT / "examples" / "plays" / "noop.py", input={},
                              org_id="lost-before-launch")
    # Play the part of a worker that claims and then vanishes (no worker is running).
    with session_scope() as session:
        claimed = claim(session, handle.id, worker_id="ghost", lease_seconds=0.2)
    assert isinstance(claimed, Claimed)
    with session_scope() as session:
        eventually(lambda: session.scalar(sa.select(Attempt.lease_expires_at < db_now())
                                          .where(Attempt.run_id == handle.id)),
                   what="the ghost's lease to expire")
    w = Worker(worker_env(**FAST_RECOVERY), beat=True)
    try:
        w.wait_ready()
        result = handle.wait(timeout=60)
    finally:
        w.stop()
    assert result.status == "succeeded"
    events = tasks.run_events(handle.id)
    deferred = [e.data for e in events if e.kind == "run.deferred"]
    assert deferred and deferred[0]["cause"] == "worker_lost"
    assert [a.generation for a in tasks.get_run(handle.id).attempts] == [1]


def test_a_worker_lost_between_launch_record_and_exec_is_retried_not_lost(
        pg_url: str) -> None:
    """The launch is recorded, the sandbox is live, but exec never happened: nothing of
    the play ran, so the inspection defers the run instead of failing it RUNNER_LOST."""
    handle = tasks.submit_run(ROOT / "examples" / "plays" / "noop.py", input={},
                              org_id=f"org-{uuid.uuid4().hex[:6]}")
    settings = get_settings()
    opened = open_attempt(handle.id, settings)
    assert isinstance(opened, Opened)
    claimed = opened.claimed
    acquired = acquire_sandbox(opened, settings)
    assert acquired.step == Step.LIVE and acquired.ref is not None
    # The sandbox recorded live and the launch recorded, and then it died before exec.
    assert record_launch(claimed.fence, settings, acquired.ref, acquired.lease_id) is not None
    with session_scope() as session:
        session.execute(sa.update(Attempt).where(Attempt.run_id == handle.id)
                        .values(lease_expires_at=db_now(-1)))
    w = Worker(worker_env(**FAST_RECOVERY), beat=True)
    try:
        w.wait_ready()
        result = handle.wait(timeout=60)
    finally:
        w.stop()
    assert result.status == "succeeded", result
    seen = kinds(handle.id)
    assert "runner.lost" not in seen
    deferred = [e.data for e in tasks.run_events(handle.id) if e.kind == "run.deferred"]
    assert [d["cause"] for d in deferred] == ["worker_lost"]
    assert "never started" in (deferred[0]["detail"] or "")
    view = tasks.get_run(handle.id)
    assert [a.generation for a in view.attempts] == [1]


@pytest.mark.parametrize("role", ["worker", "beat"])
def test_worker_and_beat_refuse_an_unmigrated_database(role: str) -> None:
    name = f"playrun_empty_{secrets.token_hex(4)}"
    psql(f'CREATE DATABASE "{name}"')
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tasks", role, "--loglevel=INFO"],
            env=worker_env(PLAYRUN_DATABASE_URL=pg_database(name)), cwd=str(ROOT),
            capture_output=True, text=True, timeout=60)
    finally:
        psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert proc.returncode != 0
    assert "playrun db upgrade" in proc.stdout + proc.stderr


def test_worker_refuses_the_development_secret_on_postgres(pg_url: str) -> None:
    env = worker_env()
    env.pop("PLAYRUN_SECRET_KEY")
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--loglevel=INFO"],
        env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "PLAYRUN_SECRET_KEY is the built-in development secret" in out
    assert "ready." not in out  # refused before consuming anything


def test_a_play_past_its_time_limit_fails_with_run_timeout(pg_url: str) -> None:
    w = Worker(worker_env(PLAYRUN_RUN_TIMEOUT_S="2"))
    try:
        w.wait_ready()
        handle = tasks.submit_run(PLAYS / "forever.py", input={}, org_id="timeouts")
        result = handle.wait(timeout=60)
        eventually(lambda: "sandbox.deleted" in kinds(handle.id), what="the sandbox deleted")
    finally:
        w.stop()
    assert (result.status, result.code) == ("failed", "RUN_TIMEOUT")
    assert "run.progress" in kinds(handle.id)  # it did start: this is not a pre-code failure


def test_worker_killed_during_a_slow_sandbox_create_runs_the_play_once(
    pg_url: str, tmp_path: Path
) -> None:
    """SIGKILL while the provider is still creating: nothing of the customer's ran, the
    reaper defers the start (same generation), a new worker runs the play exactly once."""
    from tasks.sandbox import FakeScript
    from tests.support.env import SANDBOX_ROOT

    marker = tmp_path / "ran.txt"
    script = FakeScript(SANDBOX_ROOT)
    script.reset()
    script.set(latency_ms=4000)
    # A fresh `fake` bucket: earlier tests' starts on it must not pace this one's (the
    # only deferral this test allows is the one the kill causes).
    client = redis.Redis.from_url(get_settings().redis_url)
    stale = list(client.scan_iter(match=f"{KEY_START_RATE}{{fake}}*"))
    if stale:
        client.delete(*stale)
    env = worker_env(PLAYRUN_SANDBOX_PROVIDER="fake", PLAYRUN_DEFERRAL_BASE_MS="200",
                     **FAST_RECOVERY, **HOST_FILES)
    first = Worker(env, beat=True)
    first.wait_ready()
    handle = tasks.submit_run(PLAYS / "counter.py", input={"path": str(marker), "seconds": 0.2},
                              org_id=f"org-{uuid.uuid4().hex[:6]}")
    # The provider is asked (its ledger event is written with the launch record, after).
    eventually(lambda: script.state()["creates_begun"] >= 1, what="the create to begin")
    first.stop(signal.SIGKILL)
    script.set(latency_ms=0)
    second = Worker(env, beat=True)
    try:
        second.wait_ready()
        result = handle.wait(timeout=60)
        eventually(lambda: "capacity.released" in kinds(handle.id), what="release")
    finally:
        second.stop()
        script.reset()
    assert result.status == "succeeded", result
    assert marker.read_text().count("\n") == 1
    causes = [e.data["cause"] for e in tasks.run_events(handle.id) if e.kind == "run.deferred"]
    assert causes == ["worker_lost"]
    assert [a.generation for a in tasks.get_run(handle.id).attempts] == [1]
