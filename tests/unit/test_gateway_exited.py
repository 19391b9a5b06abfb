"""The `exited` action as a sandbox's supervisor meets it, in process on SQLite: only the
exit token sends it, it asks for the lost-runner inspection at once, only while the
launch's attempt is open, and a `complete` racing it keeps first-write-wins."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

import tasks
from models import Attempt
from tasks.broker.publish import StubPublisher
from tasks.constants import QUEUE, TASK_INSPECT_ATTEMPT, TASK_RELEASE_ATTEMPTS
from tasks.gateway.app import create_app
from tasks.sandbox.fake_runners import EXIT_FILE
from tasks.security import tokens
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tasks.worker import jobs
from tests.support.gateway import launched, refused
from tests.support.helpers import eventually
from tests.support.paths import NOOP
from tests.support.runs import event_kinds, must_claim, supersede

Sent = list[tuple[str, list[Any], str]]
EXITED = {"action": "exited", "status": 0, "signal": None, "result_present": False}


@pytest.fixture
def sent() -> Sent:
    return []


@pytest.fixture
def client(sqlite_db: str, sent: Sent) -> Iterator[TestClient]:
    app = create_app(get_settings(), lambda name, args, queue: sent.append((name, args, queue)))
    with TestClient(app) as c:
        yield c
    app.state.releases.close()


def call(client: TestClient, token: str, body: Any) -> httpx.Response:
    return client.post("/v1/runtime", json=body, headers={"Authorization": f"Bearer {token}"})


def inspections(sent: Sent) -> Sent:
    return [s for s in sent if s[0] == TASK_INSPECT_ATTEMPT]


def test_an_exit_before_complete_asks_the_host_to_inspect_at_once(
        client: TestClient, sent: Sent) -> None:
    run = launched()
    with session_scope() as s:
        s.execute(sa.update(Attempt).where(Attempt.run_id == run.fence.run_id)
                  .values(host_queue="playrun.host.h1"))
    answer = call(client, run.token(tokens.EXIT_CAPABILITIES),
                  {**EXITED, "status": None, "signal": 9})
    assert answer.json() == {"ok": True, "result": {"inspecting": True}}
    fence = run.fence
    assert inspections(sent) == [(TASK_INSPECT_ATTEMPT,
                                  [fence.run_id, fence.generation, fence.lease_token, True],
                                  "playrun.host.h1")]
    assert tasks.get_run(fence.run_id).status == "running"  # the inspection decides


def test_an_exit_after_complete_changes_nothing(client: TestClient, sent: Sent) -> None:
    run = launched()
    done = call(client, run.token(), {"action": "complete", "result": {
        "status": "failed", "code": "PLAY_ERROR", "error": "boom"}})
    assert done.json()["result"]["won"] is True
    answer = call(client, run.token(tokens.EXIT_CAPABILITIES),
                  {**EXITED, "result_present": True})
    assert answer.json() == {"ok": True, "result": {"inspecting": False}}
    eventually(lambda: sent, timeout=10, what="the release task")
    assert [name for name, _, _ in sent] == [TASK_RELEASE_ATTEMPTS]
    view = tasks.get_run(run.fence.run_id)
    assert (view.status, view.code) == ("failed", "PLAY_ERROR")


def test_an_exit_of_a_superseded_launch_changes_nothing(client: TestClient, sent: Sent) -> None:
    run = launched()
    supersede(run.fence.run_id)
    assert must_claim(run.fence.run_id).generation == 2
    answer = call(client, run.token(tokens.EXIT_CAPABILITIES), EXITED)
    assert answer.json()["result"] == {"inspecting": False}
    assert inspections(sent) == []


def test_the_exit_token_reports_the_exit_and_nothing_else(client: TestClient, sent: Sent) -> None:
    run = launched()
    narrow = run.token(tokens.EXIT_CAPABILITIES)
    refused(call(client, narrow, {"action": "heartbeat"}), 403, "GATEWAY_CAPABILITY_DENIED")
    refused(call(client, narrow, {"action": "complete", "result": {
        "status": "succeeded", "output": 1}}), 403, "GATEWAY_CAPABILITY_DENIED")
    refused(call(client, narrow, {"actions": [EXITED, {"action": "heartbeat"}]}), 403,
            "GATEWAY_CAPABILITY_DENIED")
    # The runner's token (which the play can read) cannot report an exit either.
    refused(call(client, run.token(), EXITED), 403, "GATEWAY_CAPABILITY_DENIED")
    wide = run.token((tokens.RUN_EXIT, tokens.RUN_HEARTBEAT))
    refused(call(client, wide, EXITED), 401, "GATEWAY_TOKEN_INVALID")
    assert inspections(sent) == []
    assert tasks.get_run(run.fence.run_id).status == "running"


@pytest.mark.parametrize(("body", "status", "code"), [
    ({**EXITED, "status": 256}, 400, "GATEWAY_BAD_REQUEST"),
    ({**EXITED, "signal": 0}, 400, "GATEWAY_BAD_REQUEST"),
    ({**EXITED, "result_present": "yes"}, 400, "GATEWAY_BAD_REQUEST"),
    ({**EXITED, "pid": 1}, 422, "GATEWAY_UNKNOWN_FIELD"),
])
def test_a_malformed_report_is_refused(client: TestClient, sent: Sent, body: dict[str, Any],
                                       status: int, code: str) -> None:
    run = launched()
    refused(call(client, run.token(tokens.EXIT_CAPABILITIES), body), status, code)
    assert inspections(sent) == []


def test_an_exit_reported_with_no_host_queue_goes_to_the_shared_queue(
        client: TestClient, sent: Sent) -> None:
    run = launched()
    assert call(client, run.token(tokens.EXIT_CAPABILITIES), EXITED).json()["ok"] is True
    assert [queue for _, _, queue in inspections(sent)] == [QUEUE]


# --- the report racing the runner's own `complete` ---------------------------------------

RESULT = {"status": "succeeded", "output": {"n": 1}}


def ended_runner(published: StubPublisher) -> tuple[str, str, str]:
    """A launched run whose runner (hosted by the fake provider) left RESULT and exited:
    (run id, its exit token, its runner token)."""
    run_id = tasks.submit_run(NOOP, {}, org_id=f"hx-{uuid.uuid4().hex[:8]}").id
    assert jobs.start_attempt(run_id) == "launched"
    with session_scope() as s:
        generation, launch_id, sandbox_id = s.execute(sa.select(
            Attempt.generation, Attempt.launch_id, Attempt.sandbox_id)
            .where(Attempt.run_id == run_id)).one()
    sandbox = Path(get_settings().sandbox_root) / sandbox_id
    (sandbox / "result.json").write_text(json.dumps(RESULT))
    (sandbox / EXIT_FILE).write_text(json.dumps({"exit_code": 0}))

    def mint(caps: tuple[str, ...]) -> str:
        return tokens.mint(org_id=tasks.get_run(run_id).org_id, run_id=run_id,
                           generation=generation, launch_id=launch_id, capabilities=caps,
                           ttl_s=60, secret=get_settings().secret_key)

    return run_id, mint(tokens.EXIT_CAPABILITIES), mint(tokens.RUNNER_CAPABILITIES)


@pytest.mark.usefixtures("fake_stack")
def test_a_complete_processed_before_the_inspection_wins_and_the_inspection_does_nothing(
        client: TestClient, sent: Sent, published: StubPublisher) -> None:
    run_id, exit_token, runner_token = ended_runner(published)
    assert call(client, exit_token, EXITED).json()["result"] == {"inspecting": True}
    (inspection,) = inspections(sent)
    pushed = call(client, runner_token, {"action": "complete", "result": RESULT})
    assert pushed.json()["result"]["won"] is True
    jobs.inspect_attempt(*inspection[1])  # the attempt has ended: nothing to do
    view = tasks.get_run(run_id)
    assert (view.status, view.output) == ("succeeded", {"n": 1})
    found = event_kinds(run_id)
    assert found.count("run.succeeded") == 1 and "runner.lost" not in found


@pytest.mark.usefixtures("fake_stack")
def test_an_inspection_that_settles_first_settles_the_same_result(
        client: TestClient, sent: Sent, published: StubPublisher) -> None:
    run_id, exit_token, runner_token = ended_runner(published)
    assert call(client, exit_token, EXITED).json()["result"] == {"inspecting": True}
    (inspection,) = inspections(sent)
    jobs.inspect_attempt(*inspection[1])  # the result file is what the runner would push
    refused(call(client, runner_token, {"action": "complete", "result": RESULT}), 409,
            "FENCE_LOST")
    view = tasks.get_run(run_id)
    assert (view.status, view.output) == ("succeeded", {"n": 1})
    assert event_kinds(run_id).count("run.succeeded") == 1
