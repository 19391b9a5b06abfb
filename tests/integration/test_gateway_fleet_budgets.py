"""One attempt's budgets at `playrun gateway --workers 2` are the fleet's, kept in Redis:
its requests in flight, its request bucket and its hard budget of refusals hold across both
processes (not twice over), and with Redis out of reach each process still answers and
keeps budgets of its own."""

from __future__ import annotations

import http.client
import json
import re
import select
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import tasks
from tasks.host.processes import free_port
from tests.support.env import GATEWAY_DIR
from tests.support.gateway import Launched, launched, server_pid
from tests.support.helpers import eventually
from tests.support.stack import Gateway, worker_env

IN_FLIGHT, BURST, ABUSE = 4, 10, 20
HEARTBEAT = b'{"action": "heartbeat"}'


def two_process_gateway(**env: str) -> Gateway:
    sock_dir = Path(tempfile.mkdtemp(prefix="f", dir=GATEWAY_DIR))
    return Gateway(worker_env(
        PLAYRUN_GATEWAY_URL=f"http://127.0.0.1:{free_port()}",
        PLAYRUN_GATEWAY_SOCKET=str(sock_dir / "gateway.sock"),
        PLAYRUN_GATEWAY_ATTEMPT_IN_FLIGHT=str(IN_FLIGHT),
        # A burst of BURST, then one request every 100 s: the test never sees a refill.
        PLAYRUN_GATEWAY_ATTEMPT_REQUEST_BURST=str(BURST),
        PLAYRUN_GATEWAY_ATTEMPT_REQUESTS_PER_S="0.01",
        PLAYRUN_GATEWAY_ABUSE_REFUSALS=str(ABUSE), PLAYRUN_GATEWAY_ABUSE_WINDOW_S="86400",
        **env), workers=2)


@pytest.fixture(scope="module")
def gateway2(pg_url: str) -> Iterator[Gateway]:
    g = two_process_gateway()
    try:
        yield g
    finally:
        g.stop()


class Conn:
    """A keep-alive connection and the gateway process that serves it."""

    def __init__(self, gw: Gateway, pids: set[int]) -> None:
        self.port = int(gw.url.rsplit(":", 1)[1])
        self.http = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        self.http.request("GET", "/healthz")  # costs no budget: only tells whose it is
        assert self.http.getresponse().read() == b'{"ok":true}'
        assert self.http.sock is not None
        self.pid = server_pid(self.port, self.http.sock.getsockname()[1], pids)

    def start(self, token: str, body: bytes, *, held_back: int = 0) -> None:
        """Send a request, all of it but its last `held_back` bytes."""
        self.http.putrequest("POST", "/v1/runtime")
        for name, value in (("Authorization", f"Bearer {token}"),
                            ("Content-Type", "application/json"),
                            ("Content-Length", str(len(body)))):
            self.http.putheader(name, value)
        self.http.endheaders()
        self.http.send(body[:len(body) - held_back])

    def answer(self) -> tuple[int, str]:
        resp = self.http.getresponse()
        return resp.status, json.loads(resp.read()).get("code", "")

    def post(self, token: str, body: bytes) -> tuple[int, str]:
        self.start(token, body)
        return self.answer()

    def answered(self) -> bool:
        assert self.http.sock is not None
        return bool(select.select([self.http.sock], [], [], 0)[0])


def connections(gw: Gateway, per_process: int) -> list[Conn]:
    """`per_process` connections to each of the gateway's two processes, interleaved."""
    pids = set(eventually(lambda: gw.child_pids() if len(gw.child_pids()) == 2 else None,
                          what="two gateway processes"))
    by_pid: dict[int, list[Conn]] = {pid: [] for pid in pids}

    def enough() -> bool:
        conn = Conn(gw, pids)
        mine = by_pid.get(conn.pid or 0)
        if mine is None or len(mine) >= per_process:
            conn.http.close()
        else:
            mine.append(conn)
        return all(len(c) >= per_process for c in by_pid.values())

    eventually(enough, timeout=60, every=0.01, what="connections to both processes")
    return [conn for pair in zip(*by_pid.values(), strict=True) for conn in pair]


def close(conns: list[Conn]) -> None:
    for conn in conns:
        conn.http.close()


def test_requests_in_flight_are_one_budget_across_both_processes(gateway2: Gateway) -> None:
    token = launched().token()
    conns = connections(gateway2, per_process=IN_FLIGHT + 2)
    try:
        # Every request's body is held back a byte: an admitted one stays in flight.
        for conn in conns:
            conn.start(token, HEARTBEAT, held_back=1)
        # Per process, 2 x IN_FLIGHT would be admitted; across the fleet only IN_FLIGHT.
        eventually(lambda: sum(c.answered() for c in conns) == len(conns) - IN_FLIGHT,
                   what="all but the fleet's in-flight budget refused")
        refused = [c for c in conns if c.answered()]
        held = [c for c in conns if not c.answered()]
        assert {c.answer() for c in refused} == {(429, "GATEWAY_RATE_LIMITED")}
        assert {c.pid for c in refused} == {c.pid for c in conns}  # both processes refused
        for conn in held:  # the admitted ones are answered once their bodies arrive
            conn.http.send(HEARTBEAT[-1:])
            assert conn.answer() == (200, "")
        # Released (one pipeline after each answer): a new request on either process goes in.
        assert {held[0].post(token, HEARTBEAT), held[-1].post(token, HEARTBEAT)} == {(200, "")}
    finally:
        close(conns)


def test_the_request_bucket_is_one_across_both_processes(gateway2: Gateway) -> None:
    token = launched().token()
    conns = connections(gateway2, per_process=2)
    try:
        answers = [(conns[i % len(conns)].pid, conns[i % len(conns)].post(token, HEARTBEAT))
                   for i in range(3 * BURST)]
        ok = Counter(pid for pid, answer in answers if answer == (200, ""))
        # The burst once for the fleet (each process alone would have admitted it twice).
        assert sum(ok.values()) == BURST and len(ok) == 2, answers
        assert {a for _, a in answers[BURST:]} == {(429, "GATEWAY_RATE_LIMITED")}
    finally:
        close(conns)


def test_the_hard_budget_fails_the_attempt_once_across_both_processes(
        gateway2: Gateway) -> None:
    run: Launched = launched()
    token = run.token()
    conns = connections(gateway2, per_process=2)
    try:
        answers = [conns[i % len(conns)].post(token, b"{not json") for i in range(ABUSE)]
        # Each one refused (400, or 429 past the burst), ABUSE / 2 on each process.
        assert set(answers) == {(400, "GATEWAY_BAD_REQUEST"), (429, "GATEWAY_RATE_LIMITED")}
        assert tasks.get_run(run.fence.run_id).status != "failed"
        # One more, on either process, is past the fleet's count: the attempt is failed.
        assert conns[0].post(token, b"{not json") == (403, "GATEWAY_ABUSE")
        view = tasks.get_run(run.fence.run_id)
        assert (view.status, view.code) == ("failed", "GATEWAY_ABUSE")
        assert f"refused {ABUSE + 1} requests" in (view.error or "")
        # Every later request of it, on both processes, is refused at once.
        assert {c.post(token, HEARTBEAT) for c in conns} == {(403, "GATEWAY_ABUSE")}
        failed = re.findall(rf"run {run.fence.run_id} .*failed GATEWAY_ABUSE",
                            gateway2.output())
        assert len(failed) == 1, failed
    finally:
        close(conns)


def test_without_redis_each_process_answers_with_budgets_of_its_own(pg_url: str) -> None:
    g = two_process_gateway(PLAYRUN_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    try:
        token = launched().token()
        conns = connections(g, per_process=1)
        answers = [(c.pid, c.post(token, HEARTBEAT)) for c in conns for _ in range(BURST + 1)]
        ok = Counter(pid for pid, answer in answers if answer == (200, ""))
        assert sorted(ok.values()) == [BURST, BURST]  # a burst each: per process, as before
        assert Counter(a for _, a in answers)[(429, "GATEWAY_RATE_LIMITED")] == 2
        # Said once per process, not once per request.
        assert g.output().count("gateway budgets: Redis did not answer") == 2
        close(conns)
    finally:
        g.stop()
