"""The supervisor's exit report: sent once the runner's process ended, with a token the
command never sees, and bounded, so a gateway that fails never holds the supervisor."""

# ruff: noqa: F811 - test parameters named `provider` take the imported fixture
from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.host.processes import free_port
from tasks.sandbox import ExitReport, LocalProvider, ProcessStatus, SandboxSpec
from tasks.sandbox import supervisor_report as report_mod
from tasks.sandbox.local.processes import reap_children
from tasks.sandbox.local.records import top_alive
from tests.support.exit_gateway import PROBE, StubGateway
from tests.support.local_sandbox import provider, wait_exit, wait_for  # noqa: F401


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[StubGateway]:
    gateway = StubGateway(tmp_path / "gw.sock")
    yield gateway
    gateway.close()


def exec_reporting(prov: LocalProvider, code: str, gateway: StubGateway,
                   token: str) -> str:
    sid = prov.create(SandboxSpec(labels={"playrun": "1"})).sandbox_id
    prov.exec_detached(sid, ["{python}", "-c", code], env={"PLAYRUN_TOKEN": "runner-token"},
                       timeout_s=30,
                       report=ExitReport(token, f"http://127.0.0.1:{free_port()}",
                                         str(gateway.path)))
    return sid


def test_the_exit_is_reported_with_a_token_the_command_never_sees(
        provider: LocalProvider, stub: StubGateway) -> None:
    token = "exit-" + secrets.token_hex(16)
    sid = exec_reporting(provider, PROBE, stub, token)
    assert wait_exit(provider, sid) == ProcessStatus("exited", 5, False)
    wait_for(lambda: stub.requests)
    headers, body = stub.requests[0]
    assert headers["authorization"] == f"Bearer {token}"
    assert headers["x-playrun-action"] == "exited"
    assert json.loads(body) == {"action": "exited", "status": 5, "signal": None,
                                "result_present": True}
    seen = provider.read_file(sid, "seen.txt", max_bytes=32 << 20)
    assert seen is not None and b"runner-token" in seen.data  # the probe did read its env
    assert token.encode() not in seen.data
    for base in (provider.root, provider.control_root):
        for path in base.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert token.encode() not in path.read_bytes(), path
    assert len(stub.requests) == 1


def test_a_runner_killed_by_a_signal_is_reported_as_such(
        provider: LocalProvider, stub: StubGateway) -> None:
    sid = exec_reporting(provider, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                         stub, "t")
    assert wait_exit(provider, sid).exit_code == -9
    wait_for(lambda: stub.requests)
    assert json.loads(stub.requests[0][1]) == {"action": "exited", "status": None,
                                               "signal": 9, "result_present": False}


def test_a_gateway_that_never_answers_does_not_hold_the_supervisor(
        provider: LocalProvider, tmp_path: Path) -> None:
    silent = StubGateway(tmp_path / "silent.sock", status=None)
    try:
        sid = exec_reporting(provider, "raise SystemExit(0)", silent, "t")
        # The exit record comes first: a worker polling meanwhile sees the exit.
        assert wait_exit(provider, sid) == ProcessStatus("exited", 0, False)
        control = provider.control_root / sid

        def supervisor_gone() -> bool:
            reap_children()
            return not top_alive(control)

        wait_for(supervisor_gone, within=report_mod.BUDGET_S + 10)
        console = provider.read_file(sid, ".playrun/console.log", max_bytes=65536)
        assert console is not None and b"exit report was not delivered" in console.data
        assert 1 <= len(silent.requests) <= report_mod.TRIES
    finally:
        silent.close()


def test_an_unreachable_gateway_is_given_up_within_the_budget() -> None:
    started = time.monotonic()
    report = {"token": "t", "url": f"http://127.0.0.1:{free_port()}", "socket": "/nonexistent"}
    assert report_mod.report_exit(report, 0, False) is False
    assert time.monotonic() - started < report_mod.BUDGET_S + 1


@pytest.mark.parametrize(("status", "tries"), [(200, 1), (403, 1), (401, 1), (503, 3),
                                               (429, 3)])
def test_a_refusal_is_final_and_a_failure_is_retried(stub: StubGateway, status: int,
                                                     tries: int) -> None:
    stub.status = status
    report = {"token": "t", "url": "", "socket": str(stub.path)}
    assert report_mod.report_exit(report, 0, False) is (status == 200)
    assert len(stub.requests) == tries


def test_the_report_goes_over_tcp_without_a_socket() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    got: list[bytes] = []

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            got.append(conn.recv(65536))
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        report = {"token": "t", "url": f"http://127.0.0.1:{port}/prefix/", "socket": ""}
        assert report_mod.report_exit(report, 3, True) is True
    finally:
        thread.join(5)
        server.close()
    assert got[0].startswith(b"POST /prefix/v1/runtime HTTP/1.1\r\n")
    assert got[0].endswith(b'"status": 3, "signal": null, "result_present": true}')
