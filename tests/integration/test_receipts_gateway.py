"""Work receipts at the gateway: a real `playrun gateway` process and real PostgreSQL, with
attempts launched by hand (no worker). Claims, reuse, waits, takeovers and refusals; the
release and the app-code views are in test_receipts_release.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

import tasks
from models import Attempt, db_now
from tasks.execution import runner_client, runner_steps
from tasks.gateway.actions import steps as step_actions
from tasks.gateway.actions.base import Context
from tasks.gateway.beats import BeatBatcher
from tasks.gateway.refusals import Refusals
from tasks.gateway.releases import ReleaseBatcher
from tasks.security import tokens
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tests.support.gateway import Launched, call, refused
from tests.support.helpers import eventually
from tests.support.paths import HELLO
from tests.support.receipts import (
    ORG_PREFIX,
    act,
    claim,
    complete,
    launched,
    org,
    receipt,
    step_events,
)
from tests.support.runs import closes_open_runs, must_claim, supersede
from tests.support.stack import Gateway

_no_open_runs_left = closes_open_runs(ORG_PREFIX)


# --- claim, complete, reuse ----------------------------------------------------------------

def test_a_completed_step_is_reused_by_the_next_run(gateway: Gateway) -> None:
    first = launched()
    assert claim(gateway, first, "lookup:acme.com") == {"state": "run"}
    assert complete(gateway, first, "lookup:acme.com", {"employees": 12}) == {
        "state": "completed", "duplicate": False}
    second = launched(first.org_id)
    answer = claim(gateway, second, "lookup:acme.com", "c2")
    assert answer == {"state": "reuse", "output": {"employees": 12},
                      "computed_by": first.fence.run_id}
    assert step_events(first) == [("step.completed", {"key": "lookup:acme.com"})]
    assert step_events(second) == [("step.reused", {"key": "lookup:acme.com", "count": 1,
                                                    "computed_by": first.fence.run_id})]
    view = receipt(first.org_id, "lookup:acme.com")
    assert (view.status, view.output, view.run_id, view.play, view.expires_at) == (
        "completed", {"employees": 12}, first.fence.run_id, "noop", None)


def test_a_claim_flood_writes_one_reused_row_per_key_and_steps_are_budgeted(
        gateway: Gateway) -> None:
    first = launched()
    claim(gateway, first, "k")
    complete(gateway, first, "k", 1)
    second = launched(first.org_id)
    for i in range(40):
        assert claim(gateway, second, "k", f"c{i}")["state"] == "reuse"
    assert step_events(second) == [("step.reused", {"key": "k", "count": 40,
                                                    "computed_by": first.fence.run_id})]
    # Past the attempt's step budget the receipts still work; the ledger stops growing.
    context = Context(get_settings().model_copy(update={"step_max_events": 3}),
                      BeatBatcher(30.0, 0.0), ReleaseBatcher(lambda *_: None, 0.0),
                      Refusals(3000, 60.0))
    grant = tokens.Grant(second.org_id, second.fence.run_id, second.fence.generation,
                         second.launch_id, frozenset(tokens.RUNNER_CAPABILITIES),
                         time.time() + 60)
    for i in range(6):
        key = f"own{i}"
        assert step_actions.claim(grant, step_actions.StepClaim(
            action="step_claim", key=key, claim_id="c"), context)["state"] == "run"
        step_actions.complete(grant, step_actions.StepComplete(
            action="step_complete", key=key, claim_id="c", output=i), context)
    kinds = [kind for kind, _ in step_events(second)]
    assert kinds == ["step.reused", "step.completed", "step.completed"]
    spent = [e.data for e in tasks.run_events(second.fence.run_id)
             if e.kind == "ledger.budget_spent"]
    assert spent == [{"group": "steps", "budget": 3}]
    assert receipt(first.org_id, "own5").output == 5


def test_receipts_are_scoped_by_org_and_play(gateway: Gateway) -> None:
    a = launched()
    assert claim(gateway, a, "k") == {"state": "run"}
    complete(gateway, a, "k", "from a")
    other_org = launched()
    other_play = launched(a.org_id, HELLO)
    same = launched(a.org_id)
    assert claim(gateway, other_org, "k") == {"state": "run"}
    assert claim(gateway, other_play, "k") == {"state": "run"}
    assert claim(gateway, same, "k")["output"] == "from a"
    assert [r.play for r in tasks.receipts(a.org_id)] == ["hello", "noop"]
    assert [r.key for r in tasks.receipts(a.org_id, play="hello")] == ["k"]
    assert tasks.receipts(a.org_id, play=str(HELLO))[0].status == "running"


def test_a_ttl_lets_a_receipt_expire(gateway: Gateway) -> None:
    first = launched()
    claim(gateway, first, "fx:EUR")
    complete(gateway, first, "fx:EUR", 1.08, ttl_s=1.5)
    view = receipt(first.org_id, "fx:EUR")
    assert view.expires_at is not None and view.completed_at is not None
    assert 1.0 < (view.expires_at - view.completed_at).total_seconds() < 2.0
    later = launched(first.org_id)
    assert claim(gateway, later, "fx:EUR")["state"] == "reuse"
    # Past its expiry (by the database clock) the next claim runs the step again.
    eventually(lambda: claim(gateway, later, "fx:EUR", "again")["state"] == "run",
               timeout=10, every=0.2, what="the receipt to expire")
    complete(gateway, later, "fx:EUR", 1.09, "again")
    assert receipt(first.org_id, "fx:EUR").output == 1.09


def test_a_failed_step_is_run_again_by_a_later_claim(gateway: Gateway) -> None:
    first = launched()
    claim(gateway, first, "k")
    assert act(gateway, first, {"action": "step_fail", "key": "k", "claim_id": "c1",
                                "code": "PLAY_ERROR", "error": "ValueError: boom"}) == {
        "state": "failed", "duplicate": False}
    assert step_events(first)[-1] == ("step.failed", {"key": "k", "code": "PLAY_ERROR",
                                                      "error": "ValueError: boom"})
    view = receipt(first.org_id, "k")
    assert (view.status, view.code, view.error) == ("failed", "PLAY_ERROR", "ValueError: boom")
    second = launched(first.org_id)
    assert claim(gateway, second, "k") == {"state": "run"}
    view = receipt(first.org_id, "k")
    assert (view.status, view.run_id, view.claims, view.error) == (
        "running", second.fence.run_id, 2, None)


def test_a_retried_claim_is_recognised_and_another_call_waits(gateway: Gateway) -> None:
    run = launched()
    assert claim(gateway, run, "k", "mine") == {"state": "run"}
    assert claim(gateway, run, "k", "mine") == {"state": "run"}  # its answer was lost
    assert claim(gateway, run, "k", "other-thread")["state"] == "wait"
    assert receipt(run.org_id, "k").claims == 1


# --- waiting and taking over ---------------------------------------------------------------

def test_a_claim_waits_while_the_holder_lives_and_takes_over_when_it_is_fenced_out(
        gateway: Gateway) -> None:
    holder = launched()
    claim(gateway, holder, "k")
    waiter = launched(holder.org_id)
    assert claim(gateway, waiter, "k", "w") == {"state": "wait", "retry_after_s": 0.2}
    supersede(holder.fence.run_id)  # the holder's attempt is fenced out
    assert claim(gateway, waiter, "k", "w") == {"state": "run"}
    assert step_events(waiter) == [("step.taken_over", {
        "key": "k", "from_run": holder.fence.run_id, "from_generation": 1})]
    refused(call(gateway, holder.token(), {"action": "step_complete", "key": "k",
                                           "claim_id": "c1", "output": 1}), 409, "FENCE_LOST")
    complete(gateway, waiter, "k", "waiter's", "w")
    assert receipt(holder.org_id, "k").output == "waiter's"


def test_a_holder_silent_past_its_lease_is_taken_over(gateway: Gateway) -> None:
    holder = launched()
    claim(gateway, holder, "k")
    waiter = launched(holder.org_id)
    grace = get_settings().heartbeat_timeout_s
    with session_scope() as s:  # its lease ran out just inside the grace: still waited on
        s.execute(sa.update(Attempt).where(Attempt.run_id == holder.fence.run_id)
                  .values(lease_expires_at=db_now(-grace + 3)))
    assert claim(gateway, waiter, "k", "w")["state"] == "wait"
    with session_scope() as s:
        s.execute(sa.update(Attempt).where(Attempt.run_id == holder.fence.run_id)
                  .values(lease_expires_at=db_now(-grace - 1)))
    assert claim(gateway, waiter, "k", "w") == {"state": "run"}


def test_a_holder_whose_run_ended_is_taken_over(gateway: Gateway) -> None:
    holder = launched()
    claim(gateway, holder, "k")
    act(gateway, holder, {"action": "complete", "result": {"status": "succeeded", "output": 1}})
    waiter = launched(holder.org_id)
    assert claim(gateway, waiter, "k", "w") == {"state": "run"}


def test_twenty_attempts_claiming_at_once_one_runs_all_get_its_output(
        gateway: Gateway) -> None:
    org_id = org()
    runs = [launched(org_id) for _ in range(20)]
    barrier = threading.Barrier(20)
    answers: dict[int, Any] = {}

    def go(i: int) -> None:
        barrier.wait()
        answers[i] = claim(gateway, runs[i], "shared", f"c{i}")["state"]

    threads = [threading.Thread(target=go, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(answers.values()) == ["run"] + ["wait"] * 19
    (winner,) = [i for i, state in answers.items() if state == "run"]
    complete(gateway, runs[winner], "shared", {"by": winner}, f"c{winner}")
    for i, run in enumerate(runs):
        if i != winner:
            assert claim(gateway, run, "shared", f"c{i}")["output"] == {"by": winner}


def test_the_database_decides_one_claim_among_twenty_racing_handlers(pg_url: str) -> None:
    """The claim handler itself, 20 threads at once (no HTTP in between to spread them)."""
    org_id = org()
    runs = [launched(org_id) for _ in range(20)]
    context = Context(get_settings(), BeatBatcher(30.0, 0.0), ReleaseBatcher(lambda *_: None, 0.0),
                      Refusals(3000, 60.0))
    barrier = threading.Barrier(20)
    answers: dict[int, str] = {}

    def go(i: int) -> None:
        run = runs[i]
        grant = tokens.Grant(run.org_id, run.fence.run_id, run.fence.generation,
                             run.launch_id, frozenset({tokens.STEP_WRITE}), 0)
        barrier.wait()
        answers[i] = step_actions.claim(grant, step_actions.StepClaim(
            action="step_claim", key="race", claim_id=f"c{i}"), context)["state"]

    threads = [threading.Thread(target=go, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(answers.values()) == ["run"] + ["wait"] * 19
    assert receipt(org_id, "race").claims == 1


def uplink_for(run: Launched, gateway: Gateway, token: str | None = None) -> Any:
    stops: list[str] = []
    uplink = runner_client.Uplink(runner_client.Gateway(gateway.url, None),
                                  token or run.token(), "", run.launch_id, 1.0, stops.append)
    uplink.stops = stops  # type: ignore[attr-defined]
    return uplink


def test_the_runner_side_waits_and_reuses_so_fn_runs_once(gateway: Gateway) -> None:
    """20 runners' ctx.step (the sandbox's own code) on one key at once, through the
    gateway: fn runs exactly once, and every caller gets its output."""
    org_id = org()
    steps = [runner_steps.Steps(uplink_for(launched(org_id), gateway),
                                time.monotonic() + 60) for _ in range(20)]
    calls: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(20)
    results: dict[int, Any] = {}

    def fn() -> Any:
        with lock:
            calls.append(1)
        time.sleep(1.0)  # the paid call: others pile up waiting meanwhile
        return {"company": "acme", "calls": len(calls)}

    def go(i: int) -> None:
        barrier.wait()
        results[i] = steps[i].step("enrich:acme", fn)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert len(calls) == 1
    assert list(results.values()) == [{"company": "acme", "calls": 1}] * 20
    view = receipt(org_id, "enrich:acme")
    assert (view.status, view.claims) == ("completed", 1)


def test_the_runner_side_raises_clear_codes(gateway: Gateway) -> None:
    run = launched()
    steps = runner_steps.Steps(uplink_for(run, gateway), time.monotonic() + 30)
    for bad in ("", "   ", "x" * 100_000, 42, "nul\x00"):
        with pytest.raises(runner_steps.StepError) as err:
            steps.step(bad, lambda: 1)
        assert err.value.code == "STEP_KEY_INVALID"
    with pytest.raises(runner_steps.StepError) as err:
        steps.step("set", lambda: {1, 2})
    assert err.value.code == "OUTPUT_INVALID"
    with pytest.raises(runner_steps.StepError) as err:
        steps.step("big", lambda: "x" * (256 * 1024 + 1))
    assert err.value.code == "OUTPUT_INVALID"
    with pytest.raises(runner_steps.StepError) as err:
        steps.step("deep", lambda: eval("[" * 80 + "]" * 80))  # the gateway refuses it
    assert err.value.code == "OUTPUT_INVALID"
    with pytest.raises(runner_steps.StepError) as err:
        steps.step("loop", lambda: steps.step("loop", lambda: 1))
    assert err.value.code == "STEP_RECURSIVE"
    with pytest.raises(ZeroDivisionError):
        steps.step("boom", lambda: 1 / 0)
    assert steps.step("nested", lambda: [steps.step("inner", lambda: (1, 2))]) == [[1, 2]]
    statuses = {r.key: (r.status, r.code) for r in tasks.receipts(run.org_id)}
    assert statuses == {
        "set": ("failed", "OUTPUT_INVALID"), "big": ("failed", "OUTPUT_INVALID"),
        "deep": ("failed", "OUTPUT_INVALID"), "loop": ("failed", "STEP_RECURSIVE"),
        "boom": ("failed", "PLAY_ERROR"), "nested": ("completed", None),
        "inner": ("completed", None)}
    denied = runner_steps.Steps(
        uplink_for(run, gateway, run.token((tokens.RUN_HEARTBEAT,))), time.monotonic() + 30)
    with pytest.raises(runner_steps.StepError) as err:
        denied.step("k", lambda: 1)
    assert (err.value.code, err.value.refused) == ("STEP_REFUSED", "GATEWAY_CAPABILITY_DENIED")


def test_a_runner_whose_fence_is_lost_stops_at_its_next_step(gateway: Gateway) -> None:
    run = launched()
    uplink = uplink_for(run, gateway)
    steps = runner_steps.Steps(uplink, time.monotonic() + 30)
    supersede(run.fence.run_id)
    with pytest.raises(runner_steps.StepError) as err:
        steps.step("k", lambda: 1)  # the stub on_stop returns; the real one exits
    assert err.value.refused == "FENCE_LOST"
    assert uplink.stops and "FENCE_LOST" in uplink.stops[0]


# --- refusals ----------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "status", "code"), [
    ({"action": "step_claim", "key": "", "claim_id": "c"}, 400, "GATEWAY_BAD_REQUEST"),
    ({"action": "step_claim", "key": "  ", "claim_id": "c"}, 400, "GATEWAY_BAD_REQUEST"),
    # Past a step claim's body bound (16 KiB): refused before it is read whole.
    ({"action": "step_claim", "key": "x" * 100_000, "claim_id": "c"}, 413,
     "GATEWAY_BODY_TOO_LARGE"),
    ({"action": "step_claim", "key": "x" * 10_000, "claim_id": "c"}, 400,
     "GATEWAY_BAD_REQUEST"),
    ({"action": "step_claim", "key": "k", "claim_id": "no spaces"}, 400,
     "GATEWAY_BAD_REQUEST"),
    ({"action": "step_claim", "key": "k"}, 400, "GATEWAY_BAD_REQUEST"),
    ({"action": "step_claim", "key": "k", "claim_id": "c", "play": "other"}, 422,
     "GATEWAY_UNKNOWN_FIELD"),
    ({"action": "step_complete", "key": "k", "claim_id": "c"}, 400, "GATEWAY_BAD_REQUEST"),
    ({"action": "step_complete", "key": "k", "claim_id": "c", "output": 1, "ttl_s": -1},
     400, "GATEWAY_BAD_REQUEST"),
    ({"action": "step_complete", "key": "k", "claim_id": "c",
      "output": "x" * (256 * 1024)}, 400, "OUTPUT_INVALID"),
    ({"action": "step_fail", "key": "k", "claim_id": "c", "code": "lower"}, 400,
     "GATEWAY_BAD_REQUEST"),
])
def test_malformed_step_requests_are_refused(gateway: Gateway, body: dict[str, Any],
                                             status: int, code: str) -> None:
    run = launched()
    refused(call(gateway, run.token(), body), status, code)
    assert tasks.receipts(run.org_id) == []


def test_output_that_is_not_json_is_refused(gateway: Gateway) -> None:
    run = launched()
    claim(gateway, run, "k")
    raw = b'{"action": "step_complete", "key": "k", "claim_id": "c1", "output": NaN}'
    refused(call(gateway, run.token(), None, raw=raw), 400, "GATEWAY_BAD_REQUEST")
    assert receipt(run.org_id, "k").status == "running"


def test_a_token_without_step_write_is_denied(gateway: Gateway) -> None:
    run = launched()
    token = run.token((tokens.RUN_HEARTBEAT, tokens.RUN_COMPLETE))
    for action in ("step_claim", "step_complete", "step_fail"):
        refused(call(gateway, token, {"action": action, "key": "k", "claim_id": "c"}), 403,
                "GATEWAY_CAPABILITY_DENIED")
    refused(call(gateway, run.token(tokens.PROJECTION_CAPABILITIES),
                 {"action": "step_claim", "key": "k", "claim_id": "c"}), 403,
            "GATEWAY_CAPABILITY_DENIED")
    assert tasks.receipts(run.org_id) == []


def test_settling_a_receipt_this_attempt_does_not_hold_is_refused(gateway: Gateway) -> None:
    holder = launched()
    other = launched(holder.org_id)
    body = {"action": "step_complete", "key": "k", "claim_id": "c1", "output": "forged"}
    refused(call(gateway, holder.token(), body), 409, "RECEIPT_NOT_HELD")  # never claimed
    claim(gateway, holder, "k")
    refused(call(gateway, other.token(), body), 409, "RECEIPT_NOT_HELD")  # not its claim
    refused(call(gateway, holder.token(), {**body, "claim_id": "c2"}), 409, "RECEIPT_NOT_HELD")
    refused(call(gateway, other.token(), {"action": "step_fail", "key": "k", "claim_id": "c1",
                                          "code": "PLAY_ERROR"}), 409, "RECEIPT_NOT_HELD")
    view = receipt(holder.org_id, "k")
    assert (view.status, view.output, view.run_id) == ("running", None, holder.fence.run_id)


def test_completing_twice_keeps_the_first_output(gateway: Gateway) -> None:
    run = launched()
    claim(gateway, run, "k")
    complete(gateway, run, "k", {"v": 1})
    assert complete(gateway, run, "k", {"v": 1}) == {"state": "completed", "duplicate": True}
    refused(call(gateway, run.token(), {"action": "step_complete", "key": "k",
                                        "claim_id": "c1", "output": {"v": 2}}),
            409, "RECEIPT_NOT_HELD")
    refused(call(gateway, run.token(), {"action": "step_fail", "key": "k", "claim_id": "c1",
                                        "code": "PLAY_ERROR"}), 409, "RECEIPT_NOT_HELD")
    assert receipt(run.org_id, "k").output == {"v": 1}
    assert [k for k, _ in step_events(run)] == ["step.completed"]


def test_a_claim_after_the_fence_is_lost_is_refused(gateway: Gateway) -> None:
    run = launched()
    supersede(run.fence.run_id)
    assert must_claim(run.fence.run_id).generation == 2
    refused(call(gateway, run.token(), {"action": "step_claim", "key": "k", "claim_id": "c"}),
            409, "FENCE_LOST")
    assert tasks.receipts(run.org_id) == []
