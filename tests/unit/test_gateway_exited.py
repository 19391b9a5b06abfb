"""The `exited` action as a sandbox's supervisor meets it, in process on SQLite: only the
exit token sends it, and it asks for the lost-runner inspection at once, only while the
launch's attempt is open."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

import tasks
from models import Attempt
from tasks.constants import QUEUE, TASK_INSPECT_ATTEMPT, TASK_RELEASE_ATTEMPTS
from tasks.gateway.app import create_app
from tasks.security import tokens
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tests.support.gateway import launched, refused
from tests.support.helpers import eventually
from tests.support.runs import must_claim, supersede

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
