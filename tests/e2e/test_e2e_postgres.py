"""End to end on PostgreSQL + Redis with a real `celery -A tasks worker` subprocess."""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest
import sqlalchemy as sa

import tasks
from tasks.errors import (
    InputInvalidError,
    PlayNotFoundError,
    RunNotFoundError,
    RunWaitTimeoutError,
)
from tests.support.env import SANDBOX_ROOT
from tests.support.helpers import eventually, kinds
from tests.support.paths import PLAYS, ROOT
from tests.support.stack import Worker

pytestmark = pytest.mark.slow
HELLO = ROOT / "examples" / "plays" / "hello.py"


def org() -> str:
    return f"org-{uuid.uuid4().hex[:8]}"


def test_hello_runs_end_to_end_with_the_full_ledger(worker: Worker) -> None:
    handle = tasks.submit_run(HELLO, input={"name": "Ada"}, org_id=org(), idempotency_key="k1")
    result = handle.wait(timeout=60)
    assert result == tasks.RunResult("succeeded", {"greeting": "Hello, Ada!", "shout": "ADA"},
                                     None, None)
    view = tasks.get_run(handle.id)
    assert view.status == "succeeded" and view.finished_at and view.created_at
    assert view.finished_at >= view.created_at and view.finished_at.tzinfo is not None
    assert [a.generation for a in view.attempts] == [1]
    attempt = view.attempts[0]
    assert attempt.state == "ended" and attempt.sandbox_id and attempt.ended_at
    # Release follows the terminal write: wait for it, then read the whole ledger.
    eventually(lambda: "capacity.released" in kinds(handle.id), what="release")
    events = tasks.run_events(handle.id)
    seq = [e.kind for e in events]
    assert seq[:4] == ["run.admitted", "attempt.started", "sandbox.requested", "sandbox.live"]
    assert seq[-3:] == ["run.succeeded", "sandbox.deleted", "capacity.released"]
    progress = [e.data for e in events if e.kind == "run.progress"]
    assert progress[0] == {"message": "starting", "fields": {"name": "Ada"}}
    assert progress[-1] == {"message": "done", "fields": {"count": 3}}
    assert all(e.at.tzinfo is not None for e in events)
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert events[0].data["idempotency_key"] == "k1" and len(events[0].data["play_digest"]) == 64
    # The sandbox is gone from the provider's disk.
    assert not (SANDBOX_ROOT / attempt.sandbox_id).exists()


def test_idempotency_key_returns_the_same_run_and_writes_nothing(worker: Worker) -> None:
    o = org()
    first = tasks.submit_run(HELLO, input={"name": "Bo"}, org_id=o, idempotency_key="same")
    again = tasks.submit_run(HELLO, input={"name": "Other"}, org_id=o, idempotency_key="same")
    assert again.id == first.id and first.created and not again.created
    other_org = tasks.submit_run(HELLO, input={"name": "Bo"}, org_id=org(),
                                 idempotency_key="same")
    assert other_org.id != first.id
    first.wait(timeout=60)
    assert kinds(first.id).count("run.admitted") == 1
    assert kinds(first.id).count("attempt.started") == 1


@pytest.mark.parametrize(
    ("play", "code", "fragment"),
    [
        ("syntax_error.py", "PLAY_INVALID", "line 1"),
        ("no_run.py", "PLAY_INVALID", "run"),
        ("raises.py", "PLAY_ERROR", "the customer code broke"),
        ("not_json.py", "OUTPUT_INVALID", "JSON"),
    ],
)
def test_bad_plays_fail_with_a_stable_code(worker: Worker, play: str, code: str,
                                           fragment: str) -> None:
    result = tasks.submit_run(PLAYS / play, input={}, org_id=org()).wait(timeout=60)
    assert result.status == "failed" and result.code == code
    assert fragment.lower() in (result.error or "").lower()


def test_a_play_that_prints_megabytes_still_succeeds(worker: Worker) -> None:
    result = tasks.submit_run(PLAYS / "loud.py", input={}, org_id=org()).wait(timeout=90)
    assert result.status == "succeeded" and result.output == {"printed_mb": 20}


def test_the_play_sees_no_secrets(worker: Worker) -> None:
    result = tasks.submit_run(PLAYS / "env_probe.py", input={}, org_id=org()).wait(timeout=60)
    assert result.status == "succeeded"
    leaked = {k for k in result.output if k.startswith("PLAYRUN_") and k not in
              {"PLAYRUN_RUN_ID", "PLAYRUN_GENERATION", "PLAYRUN_ORG_ID"}}
    assert leaked == set()
    assert os.environ["PLAYRUN_SECRET_KEY"] not in json.dumps(result.output)
    assert "postgresql" not in json.dumps(result.output)


def test_bad_submissions_raise_clear_errors_and_write_nothing(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    with engine.connect() as c:
        before = c.scalar(sa.text("select count(*) from runs"))
    with pytest.raises(PlayNotFoundError) as missing:
        tasks.submit_run(PLAYS / "nope.py", input={}, org_id="o")
    assert missing.value.code == "PLAY_NOT_FOUND"
    with pytest.raises(InputInvalidError) as not_json:
        tasks.submit_run(HELLO, input={"s": {1, 2}}, org_id="o")
    assert not_json.value.code == "INPUT_INVALID"
    with pytest.raises(InputInvalidError):
        tasks.submit_run(HELLO, input={"nan": float("nan")}, org_id="o")
    with pytest.raises(InputInvalidError, match="limit"):
        tasks.submit_run(HELLO, input={"big": "x" * (300 * 1024)}, org_id="o")
    with pytest.raises(InputInvalidError):
        tasks.submit_run(HELLO, input={}, org_id="")
    with engine.connect() as c:
        assert c.scalar(sa.text("select count(*) from runs")) == before
    engine.dispose()


def test_unknown_run_ids_raise_run_not_found(pg_url: str) -> None:
    for call in (tasks.get_run, tasks.run_events, tasks.cancel_run):
        with pytest.raises(RunNotFoundError) as err:
            call("no-such-run")
        assert err.value.code == "RUN_NOT_FOUND"


def test_the_same_start_delivered_twice_runs_the_play_once(worker: Worker) -> None:
    # The play counts its runs in the ledger: a strict sandbox cannot write a host file.
    handle = tasks.submit_run(PLAYS / "counter.py", input={"seconds": 1}, org_id=org())
    # Two more deliveries of the same start, one with the same task id, one without.
    outbox_id = eventually(lambda: _outbox_id(handle.id), what="outbox row")
    tasks.app.send_task("playrun.start_attempt", args=[handle.id], task_id=outbox_id)
    tasks.app.send_task("playrun.start_attempt", args=[handle.id])
    assert handle.wait(timeout=60).status == "succeeded"
    # Deliveries that arrive after the terminal are no-ops too: wait until the worker
    # has processed this one, then look.
    late = str(uuid.uuid4())
    tasks.app.send_task("playrun.start_attempt", args=[handle.id], task_id=late)
    eventually(lambda: f"{late}] succeeded" in worker.output(), what="the late delivery")
    assert f"{late}] succeeded" in worker.output() and "'terminal'" in worker.output()
    ran = [e for e in tasks.run_events(handle.id)
           if e.kind == "run.progress" and e.data["message"] == "ran"]
    assert len(ran) == 1
    assert kinds(handle.id).count("attempt.started") == 1
    assert len(tasks.get_run(handle.id).attempts) == 1


def _outbox_id(run_id: str) -> str | None:
    from models import Outbox
    from tasks.store.db import session_scope

    with session_scope() as s:
        return s.scalar(sa.select(Outbox.id).where(Outbox.run_id == run_id))


def test_cancel_a_running_play_deletes_its_sandbox(worker: Worker) -> None:
    handle = tasks.submit_run(PLAYS / "forever.py", input={}, org_id=org())
    eventually(lambda: "run.progress" in kinds(handle.id), what="the play to start")
    sandbox_id = tasks.get_run(handle.id).sandbox_id
    assert sandbox_id and (SANDBOX_ROOT / sandbox_id).exists()
    tasks.cancel_run(handle.id)
    result = handle.wait(timeout=30)
    assert (result.status, result.code) == ("cancelled", "CANCELLED")
    eventually(lambda: "capacity.released" in kinds(handle.id), what="release")
    seq = kinds(handle.id)
    assert seq.index("run.cancel_requested") < seq.index("run.cancelled")
    assert "sandbox.deleted" in seq and "capacity.released" in seq
    assert not (SANDBOX_ROOT / sandbox_id).exists()
    # A second cancel changes nothing.
    assert tasks.cancel_run(handle.id).status == "cancelled"


def test_wait_honours_its_timeout(worker: Worker) -> None:
    handle = tasks.submit_run(PLAYS / "sleepy.py", input={"seconds": 5}, org_id=org())
    started = time.monotonic()
    with pytest.raises(RunWaitTimeoutError):
        handle.wait(timeout=0.5)
    assert time.monotonic() - started < 2.0
    assert handle.wait(timeout=60).status == "succeeded"
