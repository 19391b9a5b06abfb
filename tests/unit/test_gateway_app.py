"""The runtime API as a runner meets it, in process (starlette's TestClient) on SQLite:
tokens, capabilities, fences, refusals and their budget, idempotent delivery, the release
it sends."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import pytest
import sqlalchemy as sa
from pydantic import ValidationError
from starlette.testclient import TestClient

import tasks
from models import Attempt, db_now
from tasks.constants import TASK_RELEASE_ATTEMPTS
from tasks.gateway import app as gateway_app
from tasks.gateway.actions import ACTIONS, Action
from tasks.gateway.app import create_app
from tasks.gateway.refusals import Refusals
from tasks.gateway.serve import process_count
from tasks.security import tokens
from tasks.settings import Settings, get_settings
from tasks.store.db import session_scope
from tests.support.gateway import Launched, launched
from tests.support.helpers import eventually
from tests.support.runs import must_claim, supersede

Sent = list[tuple[str, list[Any], str]]


@pytest.fixture
def sent() -> Sent:
    return []


@pytest.fixture
def client(sqlite_db: str, sent: Sent) -> Iterator[TestClient]:
    app = create_app(get_settings(), lambda name, args, queue: sent.append((name, args, queue)))
    with TestClient(app) as c:
        yield c
    app.state.releases.close()


def call(client: TestClient, token: str, body: Any, *, raw: bytes | None = None
         ) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if raw is not None:
        return client.post("/v1/runtime", content=raw, headers=headers)
    return client.post("/v1/runtime", json=body, headers=headers)


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert (response.status_code, response.json()["code"]) == (status, code), response.text
    assert response.json()["error"]


def events(client: TestClient, run: Launched, key: str, *messages: str) -> httpx.Response:
    return call(client, run.token(tokens.PROJECTION_CAPABILITIES), {
        "action": "append_run_events", "idempotency_key": key,
        "delivery_lease_owner": "runner:test",
        "events": [{"seq": i, "message": m, "fields": {"i": i}} for i, m in enumerate(messages)],
    })


def progress(run_id: str) -> list[str]:
    return [e.data["message"] for e in tasks.run_events(run_id) if e.kind == "run.progress"]


def last_heartbeat(run: Launched) -> Any:
    with session_scope() as s:
        return s.scalar(sa.select(Attempt.last_heartbeat_at).where(
            Attempt.run_id == run.fence.run_id))


def lease_nearly_out(run: Launched) -> None:
    with session_scope() as s:
        s.execute(sa.update(Attempt).where(Attempt.run_id == run.fence.run_id)
                  .values(lease_expires_at=db_now(1)))


def test_healthz_answers_while_the_database_does(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"ok": True}


def test_heartbeat_renews_and_answers_cancel(client: TestClient) -> None:
    run = launched()
    lease_nearly_out(run)
    answer = call(client, run.token(), {"action": "heartbeat"}).json()["result"]
    assert answer["cancel"] is False and answer["renewed"] is True
    assert last_heartbeat(run) is not None
    again = call(client, run.token(), {"action": "heartbeat"}).json()["result"]
    assert again["renewed"] is False  # renewals are spaced: no commit for this one
    tasks.cancel_run(run.fence.run_id)
    assert call(client, run.token(), {"action": "heartbeat"}).json()["result"]["cancel"]


def test_complete_settles_once_and_sends_the_release(client: TestClient, sent: Sent) -> None:
    run = launched()
    first = call(client, run.token(), {"action": "complete", "result": {
        "status": "succeeded", "output": {"n": 1}}})
    assert first.json() == {"ok": True, "result": {"won": True, "status": "succeeded",
                                                   "code": None}}
    # A retried push, or the token replayed: refused without saying how the run ended.
    late = call(client, run.token(), {"action": "complete", "result": {
        "status": "failed", "code": "PLAY_ERROR", "error": "late"}})
    refused(late, 409, "FENCE_LOST")
    assert "succeeded" not in late.text
    view = tasks.get_run(run.fence.run_id)
    assert (view.status, view.output) == ("succeeded", {"n": 1})
    eventually(lambda: sent, timeout=10, what="the release task")
    name, args, _queue = sent[0]
    assert name == TASK_RELEASE_ATTEMPTS
    assert [h[0] for h in args[0]] == [run.fence.run_id]


def test_a_hostile_result_is_output_invalid_not_an_error(client: TestClient) -> None:
    run = launched()
    body = b'{"action": "complete", "result": {"status": "succeeded", "output": 1e400}}'
    refused(call(client, run.token(), None, raw=body), 400, "GATEWAY_BAD_REQUEST")
    answer = call(client, run.token(), {"action": "complete", "result": {
        "status": "succeeded", "output": {"x": "y" * (2 * 1024 * 1024)}}})
    assert answer.json()["result"]["won"] is True
    assert tasks.get_run(run.fence.run_id).code == "OUTPUT_INVALID"


def test_progress_delivery_is_idempotent(client: TestClient) -> None:
    run = launched()
    assert events(client, run, "k1", "a", "b").json()["result"]["accepted"] == 2
    assert events(client, run, "k1", "a", "b").json()["result"]["duplicate"] is True
    assert events(client, run, "k2", "c").json()["result"]["accepted"] == 1
    assert progress(run.fence.run_id) == ["a", "b", "c"]


def test_a_stale_generation_or_another_run_is_fence_lost(client: TestClient) -> None:
    run, other = launched(), launched()
    refused(call(client, run.token(run_id=other.fence.run_id), {"action": "heartbeat"}),
            409, "FENCE_LOST")
    supersede(run.fence.run_id)
    assert must_claim(run.fence.run_id).generation == 2
    refused(call(client, run.token(), {"action": "heartbeat"}), 409, "FENCE_LOST")
    refused(events(client, run, "late", "x"), 409, "FENCE_LOST")
    assert progress(run.fence.run_id) == []


def test_bad_tokens_are_refused(client: TestClient) -> None:
    run = launched()
    beat = {"action": "heartbeat"}
    refused(call(client, run.token(secret="not-the-secret-" + "x" * 32), beat), 401,
            "GATEWAY_TOKEN_INVALID")
    refused(call(client, run.token()[:-5], beat), 401, "GATEWAY_TOKEN_INVALID")
    refused(call(client, "", beat), 401, "GATEWAY_TOKEN_INVALID")
    now = int(time.time())
    claims = {"aud": tokens.AUDIENCE, "iat": now - 100, "exp": now - 10, "org": run.org_id,
              "run": run.fence.run_id, "gen": 1, "lch": run.launch_id,
              "cap": ["run.heartbeat"]}
    secret = get_settings().secret_key
    refused(call(client, jwt.encode(claims, secret), beat), 401, "GATEWAY_TOKEN_EXPIRED")
    scopeless = {**claims, "exp": now + 60}
    del scopeless["run"]
    refused(call(client, jwt.encode(scopeless, secret), beat), 401, "GATEWAY_TOKEN_INVALID")
    for caps in ([], ["run.ledger.project", "run.heartbeat"]):
        bad = jwt.encode({**claims, "exp": now + 60, "cap": caps}, secret)
        refused(call(client, bad, beat), 401, "GATEWAY_TOKEN_INVALID")


def test_the_projection_token_can_only_deliver_keyed_events(client: TestClient) -> None:
    run = launched()
    narrow = run.token(tokens.PROJECTION_CAPABILITIES)
    refused(call(client, narrow, {"action": "heartbeat"}), 403, "GATEWAY_CAPABILITY_DENIED")
    refused(call(client, narrow, {"action": "append_run_events", "events": [],
                                  "delivery_lease_owner": "x"}), 400, "GATEWAY_BAD_REQUEST")
    refused(call(client, run.token(), {"action": "append_run_events", "events": [],
                                       "idempotency_key": "k", "delivery_lease_owner": "x"}),
            403, "GATEWAY_CAPABILITY_DENIED")


def test_a_batch_with_one_forbidden_action_runs_nothing(client: TestClient) -> None:
    run = launched()
    lease_nearly_out(run)
    token = run.token((tokens.RUN_HEARTBEAT,))
    refused(call(client, token, {"actions": [
        {"action": "heartbeat"},
        {"action": "complete", "result": {"status": "succeeded", "output": 1}}]}),
            403, "GATEWAY_CAPABILITY_DENIED")
    assert last_heartbeat(run) is None
    assert tasks.get_run(run.fence.run_id).status == "running"
    ok = call(client, token, {"actions": [{"action": "heartbeat"}, {"action": "heartbeat"}]})
    assert ok.json()["ok"] is True and len(ok.json()["results"]) == 2


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"action": "reboot_the_fleet"}, 404, "GATEWAY_UNKNOWN_ACTION"),
    ({"action": "heartbeat", "sudo": True}, 422, "GATEWAY_UNKNOWN_FIELD"),
    ({"actions": [{"action": "heartbeat"}], "extra": 1}, 422, "GATEWAY_UNKNOWN_FIELD"),
    ({"actions": []}, 400, "GATEWAY_BAD_REQUEST"),
    ({"actions": [{"action": "heartbeat"}] * 51}, 400, "GATEWAY_BAD_REQUEST"),
    ([1, 2], 400, "GATEWAY_BAD_REQUEST"),
    ({"no": "action"}, 400, "GATEWAY_BAD_REQUEST"),
    ({"action": "step_claim", "key": " ", "claim_id": "c"}, 400, "GATEWAY_BAD_REQUEST"),
])
def test_malformed_requests_are_refused_with_their_code(
        client: TestClient, body: Any, status: int, code: str) -> None:
    refused(call(client, launched().token(), body), status, code)


@pytest.mark.parametrize(("raw", "status", "code"), [
    (b"{not json", 400, "GATEWAY_BAD_REQUEST"),
    (b"[" * 100_000, 400, "GATEWAY_BAD_REQUEST"),
    (b" " * (10 * 1024 * 1024), 413, "GATEWAY_BODY_TOO_LARGE"),
])
def test_invalid_json_and_huge_bodies_are_refused(client: TestClient, raw: bytes, status: int,
                                                  code: str) -> None:
    refused(call(client, launched().token(), None, raw=raw), status, code)


def test_steps_are_claimed_once_and_remember_their_output(client: TestClient) -> None:
    run = launched()
    token = run.token()
    claimed = call(client, token, {"action": "step_claim", "key": "fx", "claim_id": "c1"})
    assert claimed.status_code == 200, claimed.text
    done = call(client, token, {"action": "step_complete", "key": "fx", "claim_id": "c1",
                                "output": {"rate": 1.09}})
    assert done.status_code == 200, done.text
    again = call(client, token, {"action": "step_claim", "key": "fx", "claim_id": "c2"})
    assert again.json()["result"]["output"] == {"rate": 1.09}
    call(client, token, {"action": "step_claim", "key": "bad", "claim_id": "c3"})
    failed = call(client, token, {"action": "step_fail", "key": "bad", "claim_id": "c3",
                                  "code": "UPSTREAM_DOWN", "error": "503"})
    assert failed.status_code == 200, failed.text
    refused(call(client, token, {"action": "step_fail", "key": "bad", "claim_id": "c3",
                                 "code": "lower case"}), 400, "GATEWAY_BAD_REQUEST")


def test_a_database_that_stops_answering_is_503(client: TestClient,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    token = launched().token()

    def down(*_a: Any) -> Any:
        raise sa.exc.OperationalError("UPDATE attempts", {}, Exception("connection refused"))

    beat = ACTIONS["heartbeat"]
    monkeypatch.setitem(ACTIONS, "heartbeat", Action(beat.name, beat.capability, beat.model, down))
    refused(call(client, token, {"action": "heartbeat"}), 503, "GATEWAY_UNAVAILABLE")


def refused_rows(run_id: str) -> list[dict[str, Any]]:
    return [e.data for e in tasks.run_events(run_id) if e.kind == "gateway.refused"]


def test_refusals_are_gathered_into_rows_and_past_the_budget_fail_the_attempt(
        sqlite_db: str, sent: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rows only for a new code and at the end, however slowly this machine runs.
    monkeypatch.setattr(gateway_app, "Refusals", functools.partial(Refusals, every_s=3600))
    # A window this long barely drains: the 41st refusal is past the budget.
    settings = get_settings().model_copy(update={"gateway_abuse_refusals": 40,
                                                 "gateway_abuse_window_s": 86400})
    app = create_app(settings, lambda name, args, queue: sent.append((name, args, queue)))
    hostile, quiet = launched(), launched()
    with TestClient(app) as client:
        token = hostile.token()
        for _ in range(20):
            refused(call(client, token, None, raw=b"{not json"), 400, "GATEWAY_BAD_REQUEST")
            refused(call(client, token, {"action": "nope"}), 404, "GATEWAY_UNKNOWN_ACTION")
        # 40 refusals, two rows: the first of each code; the rest wait for a later row.
        assert sorted((r["code"], r["count"]) for r in refused_rows(hostile.fence.run_id)) == [
            ("GATEWAY_BAD_REQUEST", 1), ("GATEWAY_UNKNOWN_ACTION", 1)]
        assert call(client, quiet.token(), {"action": "heartbeat"}).status_code == 200
        refused(call(client, token, None, raw=b"{not json"), 403, "GATEWAY_ABUSE")
        view = tasks.get_run(hostile.fence.run_id)
        assert (view.status, view.code) == ("failed", "GATEWAY_ABUSE")
        assert "41 requests" in (view.error or "")
        # What was pending went in before the terminal: the rows add up to every refusal.
        assert sorted((r["code"], r["count"]) for r in refused_rows(hostile.fence.run_id)) == [
            ("GATEWAY_BAD_REQUEST", 1), ("GATEWAY_BAD_REQUEST", 20),
            ("GATEWAY_UNKNOWN_ACTION", 1), ("GATEWAY_UNKNOWN_ACTION", 19)]
        eventually(lambda: sent, timeout=10, what="the release task")
        assert sent[0][0] == TASK_RELEASE_ATTEMPTS
        assert [h[0] for h in sent[0][1][0]] == [hostile.fence.run_id]
        for body in ({"action": "heartbeat"}, {"action": "complete", "result": {
                "status": "succeeded", "output": 1}}):
            refused(call(client, token, body), 403, "GATEWAY_ABUSE")
        assert tasks.get_run(hostile.fence.run_id).code == "GATEWAY_ABUSE"
        # The other attempt was never touched.
        assert call(client, quiet.token(), {"action": "complete", "result": {
            "status": "succeeded", "output": 2}}).json()["result"]["won"] is True
    app.state.releases.close()


def test_the_gateway_processes_are_the_setting_or_the_cores() -> None:
    assert process_count(Settings(gateway_workers=3)) == 3
    assert 1 <= process_count(Settings(gateway_workers=None)) <= 4
    with pytest.raises(ValidationError):
        Settings(gateway_workers=0)
