"""A launch the gateway has seen lose its fence is refused from memory: a token replayed
after its run ended costs no database work, so it is answered FENCE_LOST even while the
database is cut off, for every action, and reveals nothing of the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

import tasks
from bench.chaoslib.proxy import Mode, Proxy
from tasks.host.processes import free_port
from tasks.security.tokens import EXIT_CAPABILITIES
from tests.support.gateway import call, launched, refused
from tests.support.helpers import eventually
from tests.support.session import TEST_PG_URL
from tests.support.stack import Gateway, worker_env

BEAT = {"action": "heartbeat"}
REPLAYS = [BEAT,
           {"action": "complete", "result": {"status": "failed", "code": "X", "error": "late"}},
           {"action": "append_run_events", "idempotency_key": "l:1-1:0",
            "delivery_lease_owner": "runner:l", "dropped": 0,
            "events": [{"seq": 1, "message": "x", "fields": {}}]},
           {"action": "step_claim", "key": "k", "claim_id": "c"}]


@pytest.fixture
def proxied(pg_url: str, tmp_path: Path) -> Iterator[tuple[Gateway, Proxy]]:
    """One gateway process whose database connections pass through a switchable proxy."""
    proxy = Proxy("127.0.0.1", make_url(TEST_PG_URL).port or 5432)
    url = make_url(TEST_PG_URL).set(host="127.0.0.1", port=proxy.port)
    gateway = Gateway(worker_env(PLAYRUN_DATABASE_URL=url.render_as_string(hide_password=False),
                                 PLAYRUN_GATEWAY_URL=f"http://127.0.0.1:{free_port()}",
                                 PLAYRUN_GATEWAY_SOCKET=str(tmp_path / "gateway.sock")),
                      workers=1)
    try:
        yield gateway, proxy
    finally:
        gateway.stop()
        proxy.close()


def status(gateway: Gateway, token: str) -> int:
    return call(gateway, token, BEAT).status_code


def test_a_dead_token_is_refused_from_memory_with_the_database_cut_off(
        proxied: tuple[Gateway, Proxy]) -> None:
    gateway, proxy = proxied
    done, live = launched(), launched()
    won = call(gateway, done.token(), {"action": "complete", "result": {
        "status": "succeeded", "output": {"n": 1}}})
    assert won.json()["result"]["won"] is True
    refused(call(gateway, done.token(), BEAT), 409, "FENCE_LOST")  # the database says so
    # The supervisor's exit report of the same launch is late news, not a refusal.
    late = call(gateway, done.token(EXIT_CAPABILITIES), {
        "action": "exited", "status": 0, "signal": None, "result_present": True})
    assert late.json() == {"ok": True, "result": {"inspecting": False}}, late.text
    proxy.set_mode(Mode.DROP)
    try:
        # Cut off: a live token's beat can only be answered "unavailable"...
        eventually(lambda: status(gateway, live.token()) == 503, timeout=30,
                   what="the gateway to find the database gone")
        # ...while the dead one is refused as before, for every action, fresh tokens too.
        for body in REPLAYS:
            answer = call(gateway, done.token(), body)
            refused(answer, 409, "FENCE_LOST")
            assert "succeeded" not in answer.text and done.fence.run_id not in answer.text
    finally:
        proxy.set_mode(Mode.PASS)
    eventually(lambda: status(gateway, live.token()) == 200, timeout=30,
               what="the live token answered again")
    view = tasks.get_run(done.fence.run_id)
    assert (view.status, view.output) == ("succeeded", {"n": 1})


def test_a_live_token_is_never_taken_for_a_dead_one(proxied: tuple[Gateway, Proxy]) -> None:
    """What the gateway remembers is the launch, not the run: the run's next attempt, and
    another launch, are answered by the database as before."""
    gateway, _ = proxied
    run = launched()
    other = launched()
    # Run A's launch named on run B: lost (no such launch there), and remembered so.
    refused(call(gateway, run.token(run_id=other.fence.run_id), BEAT), 409, "FENCE_LOST")
    assert status(gateway, other.token()) == 200
    assert status(gateway, run.token()) == 200
