"""One tenant cannot hurt another through the gateway. A hostile play takes its runner's
token from memory and abuses the gateway (huge cheap bodies, action floods, step-claim
floods, many slow connections; and a dead token replayed from outside, by a process at
the lowest CPU priority since an attacker's CPU is not the fleet's) while 20 runs of
other orgs and a heartbeat probe go on, on a gateway of several processes, with strict
sandboxes where bubblewrap is installed. The good runs must all succeed, their
submit -> terminal p95 stay within 1.5x of the same runs on a quiet gateway, and every
heartbeat of the probe must be answered, at p99 under 0.25 s.

On 2 shared cores the p95 of 20 runs started at once moves by about a quarter between two
quiet rounds, so quiet is the slower of two rounds and each abuse gets up to two rounds
beside it, the better of which must hold."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import tasks
from tasks.gateway.lost import PACE_S
from tasks.host.processes import free_port
from tasks.sandbox.local import probe_strict
from tasks.settings import get_settings
from tests.support.env import SANDBOX_ROOT
from tests.support.helpers import eventually, kinds
from tests.support.paths import PLAYS, ROOT
from tests.support.replay import CONNECTIONS, replaying
from tests.support.runs import FAST_STARTS
from tests.support.stack import Gateway, Worker, worker_env

pytestmark = pytest.mark.slow

HELLO = ROOT / "examples" / "plays" / "hello.py"
ABUSE = PLAYS / "abuse.py"
GOOD_RUNS = 20
ABUSE_S = 14.0
P95_FACTOR = 1.5
BEAT_P99_S = 0.25
ROUNDS = 2
GATEWAY_PROCESSES = 2  # each paces a lost launch on its own


@dataclass
class Fleet:
    gateway: Gateway
    worker: Worker
    quiet_p95: float = 0.0
    quiet_beat_p99: float = 0.0


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.fixture(scope="module")
def fleet(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    isolation = "process" if probe_strict(get_settings(), SANDBOX_ROOT) else "strict"
    url = f"http://127.0.0.1:{free_port()}"
    sock = str(tmp_path_factory.mktemp("noisy") / "gateway.sock")
    env = worker_env(PLAYRUN_GATEWAY_URL=url, PLAYRUN_GATEWAY_SOCKET=sock,
                     PLAYRUN_GATEWAY_WORKERS=str(GATEWAY_PROCESSES),
                     PLAYRUN_SANDBOX_ISOLATION=isolation,
                     **FAST_STARTS)
    gateway = Gateway(env)
    worker = Worker(env, concurrency=4, beat=True)
    try:
        worker.wait_ready()
        yield Fleet(gateway, worker)
    finally:
        worker.stop()
        gateway.stop()


def org() -> str:
    return f"nn-{uuid.uuid4().hex[:8]}"


def good_runs() -> tuple[list[float], list[float]]:
    """20 hello runs of other orgs and a heartbeat probe, at once: (submit -> terminal of
    each good run, the probe's heartbeat round trips), all of them having succeeded."""
    probe = tasks.submit_run(ABUSE, input={"mode": "probe", "seconds": 4}, org_id=org())
    handles = [tasks.submit_run(HELLO, input={"name": f"n{i}"}, org_id=org())
               for i in range(GOOD_RUNS)]
    results = [h.wait(timeout=120) for h in handles]
    assert [r.status for r in results] == ["succeeded"] * GOOD_RUNS, results
    taken = []
    for h in handles:
        view = tasks.get_run(h.id)
        assert view.finished_at is not None
        taken.append((view.finished_at - view.created_at).total_seconds())
    beats = probe.wait(timeout=120)
    assert beats.status == "succeeded", beats
    times = beats.output["beats"]
    assert times and all(t >= 0 for t in times), times  # no heartbeat was refused
    return taken, times


@pytest.fixture(scope="module")
def quiet(fleet: Fleet) -> Fleet:
    good_runs()  # warm: imports, connections, the bucket
    rounds = [good_runs() for _ in range(ROUNDS)]
    fleet.quiet_p95 = max(p(taken, 0.95) for taken, _ in rounds)
    fleet.quiet_beat_p99 = max(p(beats, 0.99) for _, beats in rounds)
    return fleet


def hostile(mode: str, **extra: Any) -> tasks.RunHandle:
    handle = tasks.submit_run(ABUSE, input={"mode": mode, "seconds": ABUSE_S, **extra},
                              org_id=org())
    eventually(lambda: "run.progress" in kinds(handle.id), timeout=60,
               what="the hostile play to be running")
    return handle


def check_neighbours(quiet: Fleet) -> None:
    """Good runs beside the abuse, in up to ROUNDS rounds: the best p95 within P95_FACTOR of
    quiet's, and every heartbeat answered well before a timeout (the best p99)."""
    seen: list[tuple[float, float]] = []
    for _ in range(ROUNDS):
        taken, beats = good_runs()
        seen.append((p(taken, 0.95), p(beats, 0.99)))
        if min(t for t, _ in seen) <= P95_FACTOR * quiet.quiet_p95 \
                and min(b for _, b in seen) < BEAT_P99_S:
            return
    assert min(t for t, _ in seen) <= P95_FACTOR * quiet.quiet_p95, (seen, quiet.quiet_p95)
    assert min(b for _, b in seen) < BEAT_P99_S, (seen, quiet.quiet_beat_p99)


@pytest.mark.parametrize("mode", ["huge", "flood"])
def test_cheap_bodies_and_action_floods_are_refused_and_neighbours_see_nothing(
        quiet: Fleet, mode: str) -> None:
    bad = hostile(mode)
    check_neighbours(quiet)
    result = bad.wait(timeout=120)
    if result.status == "succeeded":
        statuses = result.output
        refused = sum(n for s, n in statuses.items() if s in ("400", "413", "429"))
        assert refused and statuses.get("200", 0) == 0, statuses
    else:  # sustained abuse may end the attempt itself, with a code of its own
        assert result.code and result.code.startswith("GATEWAY_"), result


def test_a_step_claim_flood_writes_one_reused_row(quiet: Fleet) -> None:
    bad = hostile("steps")
    check_neighbours(quiet)
    result = bad.wait(timeout=120)
    events = tasks.run_events(bad.id)
    reused = [e.data for e in events if e.kind == "step.reused"]
    assert len(reused) <= 1, reused
    if result.status == "succeeded":
        assert result.output["claims"] > 10
        assert reused and reused[0].get("count", 0) >= 10


def test_many_slow_connections_hold_no_neighbour(quiet: Fleet) -> None:
    bad = hostile("connections", connections=200)
    check_neighbours(quiet)
    assert bad.wait(timeout=120).status in ("succeeded", "failed")


def test_a_dead_token_replayed_is_refused_for_every_action_and_reveals_nothing(
        quiet: Fleet) -> None:
    handle = tasks.submit_run(ABUSE, input={"mode": "token"}, org_id=org())
    done = handle.wait(timeout=60)
    assert done.status == "succeeded"
    started = time.monotonic()
    with replaying(quiet.gateway.url + "/v1/runtime", done.output["token"]) as replay:
        check_neighbours(quiet)
    took = time.monotonic() - started
    # Fence lost (remembered after the first), or, for what this token never could call,
    # capability denied; a replay past the budgets is refused as such.
    codes = {(status, code) for status, code in replay["codes"]}
    assert replay["sent"] >= 10 and codes <= {
        (409, "FENCE_LOST"), (403, "GATEWAY_CAPABILITY_DENIED"), (401, "GATEWAY_TOKEN_EXPIRED"),
        (403, "GATEWAY_ABUSE"), (429, "GATEWAY_RATE_LIMITED")}, replay
    # Once the launch is known lost its refusals are paced (by each gateway process), however
    # fast it asks; only the requests in flight before that (one per connection, each
    # answered by the database) are not.
    paced = took / PACE_S * GATEWAY_PROCESSES
    assert replay["sent"] <= paced + 2 * CONNECTIONS, (replay["sent"], took)
    assert replay["leaks"] == []
    assert kinds(handle.id).count("run.succeeded") == 1  # the replayed complete changed nothing


def test_the_fleet_is_whole_after_the_abuse(quiet: Fleet) -> None:
    """After every abuse, a plain run still succeeds (nothing left stuck or poisoned)."""
    assert tasks.submit_run(HELLO, input={"name": "after"}, org_id=org()).wait(
        timeout=60).status == "succeeded"
