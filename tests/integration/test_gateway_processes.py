"""`playrun gateway --workers 2` as real processes: both serve the same TCP port and Unix
socket, one killed is replaced while the other serves, SIGTERM to the parent leaves none
behind, and a body trickled into one connection holds no other request."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tasks.host.processes import free_port, pid_alive
from tests.support.env import GATEWAY_DIR
from tests.support.gateway import launched, server_pid
from tests.support.helpers import eventually
from tests.support.metrics import endpoint, scrape
from tests.support.stack import Gateway, worker_env


def own_gateway(workers: int = 2) -> Gateway:
    sock_dir = Path(tempfile.mkdtemp(prefix="p", dir=GATEWAY_DIR))
    return Gateway(worker_env(PLAYRUN_GATEWAY_URL=f"http://127.0.0.1:{free_port()}",
                              PLAYRUN_GATEWAY_SOCKET=str(sock_dir / "gateway.sock")),
                   workers=workers)


@pytest.fixture(scope="module")
def gateway2(pg_url: str) -> Iterator[Gateway]:
    g = own_gateway()
    yield g
    g.stop()


def socket_path(gw: Gateway) -> str:
    return gw.env["PLAYRUN_GATEWAY_SOCKET"]


def port(gw: Gateway) -> int:
    return int(gw.url.rsplit(":", 1)[1])


def healthy(gw: Gateway) -> bool:
    over_tcp = httpx.get(gw.url + "/healthz", timeout=10)
    with httpx.Client(transport=httpx.HTTPTransport(uds=socket_path(gw))) as uds:
        over_uds = uds.get("http://gateway/healthz", timeout=10)
    return bool(over_tcp.json() == over_uds.json() == {"ok": True})


def processes(gw: Gateway) -> set[int]:
    """The parent's live children (a killed one is a zombie until the parent reaps it)."""
    found = set()
    for pid in gw.child_pids():
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.add(pid)
        except OSError:
            continue
    return found


def serving(gw: Gateway, without: int = 0) -> set[int]:
    """The gateway's two processes, once there are two (and `without` is not one)."""
    def two() -> set[int] | None:
        now = processes(gw)
        return now if len(now) == 2 and without not in now else None

    return eventually(two, what="two gateway processes")


def answering_pid(gw: Gateway, conn: socket.socket, pids: set[int]) -> int | None:
    """Which of `pids` holds the server end of `conn` (an answered, open connection)."""
    return server_pid(port(gw), conn.getsockname()[1], pids)


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n", b'{"ok":true}'
FORGED = (b"POST /v1/runtime HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer forged\r\n"
          b"Content-Length: 2\r\n\r\n{}", b"GATEWAY_TOKEN_INVALID")


def ask(gw: Gateway, request: tuple[bytes, bytes]) -> socket.socket:
    """A connection that sent `request` and read its answer, left open."""
    conn = socket.create_connection(("127.0.0.1", port(gw)), timeout=10)
    conn.sendall(request[0])
    answer = b""
    while request[1] not in answer:
        chunk = conn.recv(4096)
        assert chunk, answer
        answer += chunk
    return conn


def from_each(gw: Gateway, request: tuple[bytes, bytes]) -> int:
    """Send `request` on new connections until each process answered one; how many."""
    pids = serving(gw)
    held: list[socket.socket] = []
    answered: set[int] = set()

    def each_answered() -> bool:
        held.append(ask(gw, request))
        answered.add(answering_pid(gw, held[-1], pids) or 0)
        return answered >= pids

    try:
        eventually(each_answered, timeout=60, every=0.01, what="an answer from each process")
    finally:
        for conn in held:
            conn.close()
    return len(held)


def test_both_processes_serve_the_one_port_and_the_one_socket(gateway2: Gateway) -> None:
    assert healthy(gateway2)
    assert from_each(gateway2, HEALTHZ) >= 2
    assert gateway2.since_start().count(b"gateway ready") == 1


def test_the_metrics_endpoint_sums_every_process(gateway2: Gateway) -> None:
    url = endpoint(gateway2.env, "gateway", gateway2.proc)  # type: ignore[arg-type]
    refused = ("playrun_gateway_requests_total",
               (("action", "unknown"), ("code", "GATEWAY_TOKEN_INVALID")))
    before = scrape(url).get(refused, 0.0)
    sent = from_each(gateway2, FORGED)
    assert scrape(url)[refused] == before + sent
    victim = min(serving(gateway2))
    os.kill(victim, signal.SIGKILL)  # what a dead process counted stays in the sum
    serving(gateway2, without=victim)
    assert scrape(url)[refused] == before + sent


def test_a_killed_process_is_replaced_and_the_gateway_goes_on(gateway2: Gateway) -> None:
    before = serving(gateway2)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    after = serving(gateway2, without=victim)
    assert before - {victim} <= after
    assert healthy(gateway2)
    gateway2.wait_for(f"gateway process {victim} ended (killed by SIGKILL); starting another")
    assert gateway2.since_start().count(b"gateway ready") == 1  # said once, at start


def test_sigterm_to_the_parent_leaves_no_process_behind(pg_url: str) -> None:
    g = own_gateway()
    try:
        pids = serving(g)
        os.kill(g.pid, signal.SIGTERM)
        assert g.proc is not None and g.proc.wait(timeout=30) == 0
        assert not [pid for pid in pids if pid_alive(pid)]
        with pytest.raises(httpx.ConnectError):  # nothing listens on the port any more
            httpx.get(g.url + "/healthz", timeout=5)
    finally:
        g.stop()


def test_a_trickled_body_holds_its_connection_not_the_gateway(gateway2: Gateway) -> None:
    run = launched()
    size = 1024 * 1024
    slow = socket.create_connection(("127.0.0.1", port(gateway2)), timeout=10)
    slow.sendall(f"POST /v1/runtime HTTP/1.1\r\nHost: gateway\r\n"
                 f"Authorization: Bearer {run.token()}\r\nX-Playrun-Action: complete\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode()
                 + b'{"action": "complete", "result": {"status": "succeeded", "output": "')
    done = threading.Event()

    def trickle() -> None:
        while not done.wait(0.05):  # a few hundred bytes at a time, never the whole body
            slow.sendall(b"x" * 256)

    sender = threading.Thread(target=trickle)
    sender.start()
    try:
        beats = [httpx.post(gateway2.url + "/v1/runtime", timeout=10,
                            headers={"Authorization": f"Bearer {run.token()}"},
                            json={"action": "heartbeat"}) for _ in range(20)]
        assert [b.status_code for b in beats] == [200] * 20
        assert all(b.json()["ok"] for b in beats)
        slow.setblocking(False)
        with pytest.raises(BlockingIOError):  # still reading the slow body: no answer yet
            slow.recv(1)
    finally:
        done.set()
        sender.join()
        slow.close()
