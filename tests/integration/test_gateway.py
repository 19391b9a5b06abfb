"""The gateway as a hostile runner meets it: a real `playrun gateway` process, real
PostgreSQL; tokens, capabilities, fences, refusals and idempotent delivery."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import httpx
import jwt
import pytest
import sqlalchemy as sa

import tasks
from models import Attempt, EventDelivery, db_now
from tasks.gateway.actions import events as event_actions
from tasks.gateway.actions.base import Context
from tasks.gateway.beats import BeatBatcher
from tasks.gateway.refusals import Refusals
from tasks.gateway.releases import ReleaseBatcher
from tasks.host.processes import free_port
from tasks.security import tokens
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tasks.store.fence import Fence
from tests.support.gateway import Launched, call, launched, refused
from tests.support.paths import ROOT
from tests.support.runs import must_claim, supersede
from tests.support.stack import Gateway, worker_env


def events(gw: Gateway, run: Launched, key: str, *messages: str) -> httpx.Response:
    return call(gw, run.token(tokens.PROJECTION_CAPABILITIES), {
        "action": "append_run_events", "idempotency_key": key,
        "delivery_lease_owner": "runner:test",
        "events": [{"seq": i, "message": m, "fields": {"i": i}} for i, m in enumerate(messages)],
    })


def progress(run_id: str) -> list[str]:
    return [e.data["message"] for e in tasks.run_events(run_id) if e.kind == "run.progress"]


def last_heartbeat(fence: Fence) -> Any:
    with session_scope() as s:
        return s.scalar(sa.select(Attempt.last_heartbeat_at).where(
            Attempt.run_id == fence.run_id))


def test_healthz(gateway: Gateway) -> None:
    assert httpx.get(gateway.url + "/healthz").json() == {"ok": True}


def test_heartbeat_renews_and_answers_cancel(gateway: Gateway) -> None:
    run = launched()
    with session_scope() as s:  # the lease is nearly out: this beat must renew it
        s.execute(sa.update(Attempt).where(Attempt.run_id == run.fence.run_id)
                  .values(lease_expires_at=db_now(1)))
    answer = call(gateway, run.token(), {"action": "heartbeat"}).json()["result"]
    assert answer["cancel"] is False and answer["renewed"] is True
    assert last_heartbeat(run.fence) is not None
    again = call(gateway, run.token(), {"action": "heartbeat"}).json()["result"]
    assert again["renewed"] is False  # renewals are spaced: no commit for this one
    tasks.cancel_run(run.fence.run_id)
    assert call(gateway, run.token(), {"action": "heartbeat"}).json()["result"]["cancel"]


def test_a_runner_beating_past_its_time_limit_is_told_to_stop(gateway: Gateway) -> None:
    run = launched()
    with session_scope() as s:
        s.execute(sa.update(Attempt).where(Attempt.run_id == run.fence.run_id)
                  .values(runner_deadline=db_now(-1), lease_expires_at=db_now(1)))
    answer = call(gateway, run.token(), {"action": "heartbeat"}).json()["result"]
    assert (answer["cancel"], answer["renewed"]) == (True, False)
    with session_scope() as s:  # the lease is left to run out: the reaper inspects it
        assert s.scalar(sa.select(Attempt.lease_expires_at < db_now(2)).where(
            Attempt.run_id == run.fence.run_id))


def test_complete_settles_once_and_a_spent_token_learns_nothing(gateway: Gateway) -> None:
    run = launched()
    first = call(gateway, run.token(), {"action": "complete", "result": {
        "status": "succeeded", "output": {"n": 1}}})
    assert first.json()["result"] == {"won": True, "status": "succeeded", "code": None}
    # The runner retrying its push, or the token replayed: every action is refused alike.
    late = call(gateway, run.token(), {"action": "complete", "result": {
        "status": "failed", "code": "PLAY_ERROR", "error": "late"}})
    refused(late, 409, "FENCE_LOST")
    assert "succeeded" not in late.text and run.fence.run_id not in late.text
    for body in ({"action": "heartbeat"}, {"action": "step_claim", "key": "k", "claim_id": "c"},
                 {"action": "sheet_read", "table": "t"}):
        answer = call(gateway, run.token(), body)
        refused(answer, 409, "FENCE_LOST")
        assert "succeeded" not in answer.text and run.fence.run_id not in answer.text
    refused(events(gateway, run, "late", "x"), 409, "FENCE_LOST")
    view = tasks.get_run(run.fence.run_id)
    assert (view.status, view.output) == ("succeeded", {"n": 1})


def test_a_cancelled_runs_push_is_refused_as_spent(gateway: Gateway) -> None:
    run = launched()
    tasks.cancel_run(run.fence.run_id)
    refused(call(gateway, run.token(), {"action": "complete", "result": {
        "status": "succeeded", "output": 1}}), 409, "FENCE_LOST")


def test_a_hostile_result_is_output_invalid_not_an_error(gateway: Gateway) -> None:
    run = launched()
    body = b'{"action": "complete", "result": {"status": "succeeded", "output": 1e400}}'
    refused(call(gateway, run.token(), None, raw=body), 400, "GATEWAY_BAD_REQUEST")
    deep = {"status": "succeeded", "output": {"x": "y" * (2 * 1024 * 1024)}}
    answer = call(gateway, run.token(), {"action": "complete", "result": deep})
    assert answer.json()["result"]["won"] is True
    assert tasks.get_run(run.fence.run_id).code == "OUTPUT_INVALID"


def test_progress_delivery_is_idempotent_and_budgeted(gateway: Gateway) -> None:
    run = launched()
    assert events(gateway, run, "k1", "a", "b").json()["result"]["accepted"] == 2
    assert events(gateway, run, "k1", "a", "b").json()["result"]["duplicate"] is True
    assert events(gateway, run, "k2", "c").json()["result"]["accepted"] == 1
    assert progress(run.fence.run_id) == ["a", "b", "c"]


def test_a_stale_generation_or_another_run_is_fence_lost(gateway: Gateway) -> None:
    run = launched()
    other = launched()
    # Run A's launch named on run B: nothing matches, nothing is written.
    refused(call(gateway, run.token(run_id=other.fence.run_id), {"action": "heartbeat"}),
            409, "FENCE_LOST")
    supersede(run.fence.run_id)
    assert must_claim(run.fence.run_id).generation == 2  # generation 2 started
    refused(call(gateway, run.token(), {"action": "heartbeat"}), 409, "FENCE_LOST")
    refused(events(gateway, run, "late", "x"), 409, "FENCE_LOST")
    assert progress(run.fence.run_id) == []


def test_bad_tokens_are_refused(gateway: Gateway) -> None:
    run = launched()
    beat = {"action": "heartbeat"}
    refused(call(gateway, run.token(secret="not-the-secret-" + "x" * 32), beat), 401,
            "GATEWAY_TOKEN_INVALID")
    refused(call(gateway, run.token()[:-5], beat), 401, "GATEWAY_TOKEN_INVALID")
    refused(call(gateway, "", beat), 401, "GATEWAY_TOKEN_INVALID")
    expired = jwt.encode({"aud": tokens.AUDIENCE, "iat": int(time.time()) - 100,
                          "exp": int(time.time()) - 10, "org": run.org_id,
                          "run": run.fence.run_id, "gen": 1, "lch": run.launch_id,
                          "cap": ["run.heartbeat"]}, get_settings().secret_key)
    refused(call(gateway, expired, beat), 401, "GATEWAY_TOKEN_EXPIRED")


def test_the_projection_token_can_only_deliver_keyed_events(gateway: Gateway) -> None:
    run = launched()
    narrow = run.token(tokens.PROJECTION_CAPABILITIES)
    refused(call(gateway, narrow, {"action": "heartbeat"}), 403, "GATEWAY_CAPABILITY_DENIED")
    refused(call(gateway, narrow, {"action": "complete", "result": {}}), 403,
            "GATEWAY_CAPABILITY_DENIED")
    refused(call(gateway, narrow, {"action": "append_run_events", "events": [],
                                   "delivery_lease_owner": "x"}), 400, "GATEWAY_BAD_REQUEST")
    refused(call(gateway, narrow, {"action": "append_run_events", "events": [],
                                   "idempotency_key": " ", "delivery_lease_owner": "x"}),
            400, "GATEWAY_BAD_REQUEST")
    # ... and the runner's own token cannot deliver them.
    refused(call(gateway, run.token(), {"action": "append_run_events", "events": [],
                                        "idempotency_key": "k", "delivery_lease_owner": "x"}),
            403, "GATEWAY_CAPABILITY_DENIED")


def test_a_batch_with_one_forbidden_action_runs_nothing(gateway: Gateway) -> None:
    run = launched()
    with session_scope() as s:
        s.execute(sa.update(Attempt).where(Attempt.run_id == run.fence.run_id)
                  .values(lease_expires_at=db_now(1)))
    token = run.token((tokens.RUN_HEARTBEAT,))
    refused(call(gateway, token, {"actions": [
        {"action": "heartbeat"}, {"action": "complete", "result": {"status": "succeeded",
                                                                    "output": 1}}]}),
            403, "GATEWAY_CAPABILITY_DENIED")
    assert last_heartbeat(run.fence) is None
    assert tasks.get_run(run.fence.run_id).status == "running"
    ok = call(gateway, token, {"actions": [{"action": "heartbeat"}, {"action": "heartbeat"}]})
    assert len(ok.json()["results"]) == 2


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"action": "reboot_the_fleet"}, 404, "GATEWAY_UNKNOWN_ACTION"),
    ({"action": "heartbeat", "sudo": True}, 422, "GATEWAY_UNKNOWN_FIELD"),
    ({"actions": [{"action": "heartbeat"}], "extra": 1}, 422, "GATEWAY_UNKNOWN_FIELD"),
    ({"actions": []}, 400, "GATEWAY_BAD_REQUEST"),
    ([1, 2], 400, "GATEWAY_BAD_REQUEST"),
    ({"no": "action"}, 400, "GATEWAY_BAD_REQUEST"),
])
def test_malformed_requests_are_refused_with_their_code(
        gateway: Gateway, body: Any, status: int, code: str) -> None:
    refused(call(gateway, launched().token(), body), status, code)


def test_invalid_json_and_huge_bodies_are_refused(gateway: Gateway) -> None:
    token = launched().token()
    refused(call(gateway, token, None, raw=b"{not json"), 400, "GATEWAY_BAD_REQUEST")
    refused(call(gateway, token, None, raw=b"[" * 100_000), 400, "GATEWAY_BAD_REQUEST")
    refused(call(gateway, token, None, raw=b" " * (10 * 1024 * 1024)), 413,
            "GATEWAY_BODY_TOO_LARGE")


def test_the_gateway_refuses_the_development_secret_on_postgres(pg_url: str) -> None:
    env = worker_env(PLAYRUN_GATEWAY_URL=f"http://127.0.0.1:{free_port()}")
    env.pop("PLAYRUN_SECRET_KEY")
    proc = subprocess.run([sys.executable, "-m", "tasks.cli.main", "gateway"], env=env,
                          cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "CONFIG_INVALID" in proc.stderr and "PLAYRUN_SECRET_KEY" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_past_the_progress_budget_deliveries_are_counted_not_stored(pg_url: str) -> None:
    run = launched()
    context = Context(get_settings().model_copy(update={"progress_max_events": 2}),
                      BeatBatcher(30.0, 0.0), ReleaseBatcher(lambda *_: None, 0.0),
                      Refusals(3000, 60.0))
    grant = tokens.Grant(run.org_id, run.fence.run_id, run.fence.generation, run.launch_id,
                         frozenset(tokens.PROJECTION_CAPABILITIES), time.time() + 60)

    def deliver(key: str, n: int) -> dict[str, Any]:
        return event_actions.handle(grant, event_actions.AppendRunEvents(
            action="append_run_events", idempotency_key=key, delivery_lease_owner="r",
            events=[event_actions.ProgressItem(seq=i, message=f"m{i}") for i in range(n)]),
            context)

    assert deliver("k0", 3)["full"] is True
    for i in range(1, 30):
        assert deliver(f"k{i}", 2) == {"duplicate": False, "accepted": 0, "dropped": 2,
                                       "full": True}
    assert progress(run.fence.run_id) == ["m0", "m1"]
    with session_scope() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(EventDelivery).where(
            EventDelivery.run_id == run.fence.run_id)) == 1
        assert s.scalar(sa.select(Attempt.progress_dropped).where(
            Attempt.run_id == run.fence.run_id)) == 1 + 29 * 2


def test_bodies_are_bounded_by_their_action_and_their_structure(gateway: Gateway) -> None:
    token = launched().token()
    beat = {"Content-Type": "application/json", "Authorization": f"Bearer {token}",
            "X-Playrun-Action": "heartbeat"}
    # Named in the header: refused from Content-Length, before the body is read.
    big = httpx.post(gateway.url + "/v1/runtime", headers=beat, timeout=30,
                     content=b'{"action": "heartbeat"}' + b" " * (8 * 1024))
    refused(big, 413, "GATEWAY_BODY_TOO_LARGE")
    ok = httpx.post(gateway.url + "/v1/runtime", headers=beat, json={"action": "heartbeat"})
    assert ok.json()["ok"] is True
    other = httpx.post(gateway.url + "/v1/runtime", headers=beat,
                       json={"action": "step_claim", "key": "k", "claim_id": "c"})
    refused(other, 400, "GATEWAY_BAD_REQUEST")
    # Unnamed: the body's own actions bound it once read.
    refused(call(gateway, token, None, raw=b'{"action": "step_claim", "key": "'
                 + b"k" * (20 * 1024) + b'", "claim_id": "c"}'), 413, "GATEWAY_BODY_TOO_LARGE")
    cheap = b'{"action": "heartbeat", "x": [' + b"0," * 300_000 + b"0]}"
    refused(call(gateway, token, None, raw=cheap), 400, "GATEWAY_BAD_REQUEST")
