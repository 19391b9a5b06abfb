"""Refused requests at a real gateway on PostgreSQL: a flood is gathered into a few
`gateway.refused` rows that add up to every refusal, the gateway counts refusals by org,
and past the hard budget it fails the attempt GATEWAY_ABUSE: its sandbox is deleted, its
capacity freed, its token refused, while another org's run at the same time succeeds."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa

import tasks
from models import Attempt
from tasks.constants import GATEWAY_REFUSED_MAX_EVENTS
from tasks.host.processes import free_port
from tasks.security import tokens
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tests.support.env import GATEWAY_DIR
from tests.support.gateway import call, launched, refused
from tests.support.helpers import eventually, kinds
from tests.support.metrics import endpoint, scrape
from tests.support.paths import PLAYS
from tests.support.runs import FAST_STARTS, closes_open_runs, org_namer
from tests.support.stack import Gateway, Worker, worker_env

ABUSE = 300  # refusals an attempt may have (the window is long: they barely drain)
ORGS = "gwr-"
org = org_namer(ORGS)
_no_open_runs_left = closes_open_runs(ORGS)


@pytest.fixture(scope="module")
def env(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    port = free_port()
    return worker_env(
        **FAST_STARTS,
        PLAYRUN_GATEWAY_URL=f"http://127.0.0.1:{port}",
        PLAYRUN_GATEWAY_SOCKET=str(GATEWAY_DIR / f"r{port}" / "gateway.sock"),
        PLAYRUN_METRICS_DIR=str(tmp_path_factory.mktemp("metrics")),
        PLAYRUN_GATEWAY_ABUSE_REFUSALS=str(ABUSE), PLAYRUN_GATEWAY_ABUSE_WINDOW_S="86400")


@pytest.fixture(scope="module")
def gateway(env: dict[str, str]) -> Iterator[Gateway]:
    """A gateway of its own: its counters start at zero and its budget is small."""
    g = Gateway(env)
    try:
        yield g
    finally:
        g.stop()
        print("--- gateway\n", g.output()[-3000:])


@pytest.fixture(scope="module")
def worker(env: dict[str, str], gateway: Gateway) -> Iterator[Worker]:
    w = Worker(env, beat=False)
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()


def refused_rows(run_id: str) -> list[dict[str, Any]]:
    return [e.data for e in tasks.run_events(run_id) if e.kind == "gateway.refused"]


def by_code(rows: list[dict[str, Any]]) -> Counter[str]:
    totals: Counter[str] = Counter()
    for row in rows:
        totals[row["code"]] += row["count"]
    return totals


def assert_rows_cover(run_id: str, refusals: Counter[str]) -> None:
    """The ledger's bound (docs/design.md): the first refusal of each code is a row of its
    own, the rest are gathered; within the rows' budget they add up to every refusal,
    past it one `ledger.budget_spent` row says the rest were only counted."""
    rows = refused_rows(run_id)
    assert all(set(r) == {"code", "count"} and r["count"] >= 1 for r in rows), rows
    assert {code: min(r["count"] for r in rows if r["code"] == code) for code in refusals} \
        == dict.fromkeys(refusals, 1), rows
    spent = [e.data for e in tasks.run_events(run_id) if e.kind == "ledger.budget_spent"]
    if len(rows) < GATEWAY_REFUSED_MAX_EVENTS:  # a slow machine may take long enough
        assert (by_code(rows), spent) == (refusals, []), rows
    else:
        assert len(rows) == GATEWAY_REFUSED_MAX_EVENTS and by_code(rows) <= refusals, rows
        assert spent == [{"group": "gateway.refused", "budget": GATEWAY_REFUSED_MAX_EVENTS}]


def test_a_flood_is_gathered_into_a_few_rows_and_counted_by_org(
        gateway: Gateway, env: dict[str, str]) -> None:
    run = launched()
    token = run.token()
    bodies: list[tuple[Any, bytes | None]] = [
        (None, b"{not json"), ({"action": "nope"}, None),
        ({"action": "heartbeat", "sudo": True}, None)]

    def send(i: int) -> str:
        body, raw = bodies[i % len(bodies)]
        answer = call(gateway, token, body, raw=raw)
        assert answer.status_code in (400, 404, 422, 429), answer.text
        return str(answer.json()["code"])

    with ThreadPoolExecutor(8) as pool:
        codes = Counter(pool.map(send, range(240)))
    assert codes.total() == 240 and len(codes) >= 3
    # The first of each code went in at once; the rest are gathered, not a row each.
    during = refused_rows(run.fence.run_id)
    assert {r["code"] for r in during} == set(codes)
    assert len(during) <= GATEWAY_REFUSED_MAX_EVENTS
    done = call(gateway, token, {"action": "complete", "result": {
        "status": "succeeded", "output": {}}})
    assert done.json()["result"]["won"] is True
    # What was still gathered went in before the terminal.
    assert_rows_cover(run.fence.run_id, codes)
    samples = scrape(endpoint(env, "gateway", gateway.proc))  # type: ignore[arg-type]
    counted = {dict(labels)["code"]: value for (name, labels), value in samples.items()
               if name == "playrun_gateway_refusals_total"
               and dict(labels)["org"] == run.org_id}
    assert counted == {code: float(n) for code, n in codes.items()}


def _token_of(run_id: str, org_id: str) -> str:
    with session_scope() as s:
        generation, launch_id = s.execute(sa.select(Attempt.generation, Attempt.launch_id)
                                          .where(Attempt.run_id == run_id)).one()
    return tokens.mint(org_id=org_id, run_id=run_id, generation=generation,
                       launch_id=launch_id, capabilities=tokens.RUNNER_CAPABILITIES,
                       ttl_s=60, secret=get_settings().secret_key)


def test_sustained_abuse_fails_the_attempt_and_frees_its_sandbox_and_no_other(
        gateway: Gateway, worker: Worker) -> None:
    hostile_org = org()
    hostile = tasks.submit_run(PLAYS / "gateway_flood.py", input={}, org_id=hostile_org)
    quiet = tasks.submit_run(PLAYS / "sleepy.py", input={"seconds": 3}, org_id=org())
    ended = hostile.wait(timeout=90)
    assert (ended.status, ended.code) == ("failed", "GATEWAY_ABUSE"), ended
    found = re.search(r"refused (\d+) requests", ended.error or "")
    assert found and int(found[1]) > ABUSE, ended.error
    eventually(lambda: {"sandbox.deleted", "capacity.released"} <= set(kinds(hostile.id)),
               timeout=30, what="the hostile run's sandbox deleted and its capacity freed")
    # The error names the refusals by code; what was gathered went in with the end.
    named = Counter({code: int(n) for code, n in re.findall(r"(GATEWAY_\w+) (\d+)",
                                                           ended.error or "")})
    assert named.total() == int(found[1])
    assert_rows_cover(hostile.id, named)
    # Its token is refused for every action from now on; the run stays as it ended.
    token = _token_of(hostile.id, hostile_org)
    for body in ({"action": "heartbeat"}, {"action": "complete", "result": {
            "status": "succeeded", "output": 1}}):
        refused(call(gateway, token, body), 403, "GATEWAY_ABUSE")
    assert tasks.get_run(hostile.id).code == "GATEWAY_ABUSE"
    # Another org's run, at the same time on the same gateway, went on untouched.
    calm = quiet.wait(timeout=90)
    assert (calm.status, calm.output) == ("succeeded", {"slept": 3.0})
    assert refused_rows(quiet.id) == []
