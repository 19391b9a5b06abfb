"""`playrun providers list|check` as a user before going live would run them."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tasks.cli.main import app
from tasks.sandbox import LocalProvider
from tasks.sandbox.providers.check import run_check
from tasks.settings import Settings, reset_settings


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def gateway_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_every_step_passes_and_nothing_is_left(tmp_path: Path, gateway_url: str) -> None:
    prov = LocalProvider(tmp_path, isolation="process")
    report = run_check(Settings(gateway_url=gateway_url), lambda: prov)
    assert [(s.name, s.ok) for s in report.steps] == [
        ("credentials", True), ("list", True), ("create", True),
        ("python and gateway from inside", True), ("delete", True)]
    assert "/healthz 200" in report.steps[3].detail
    assert prov.list({}) == []


def test_a_gateway_the_sandbox_cannot_reach_fails_its_step_and_still_deletes(
        tmp_path: Path) -> None:
    prov = LocalProvider(tmp_path, isolation="process")
    report = run_check(Settings(gateway_url="http://127.0.0.1:1"), lambda: prov)
    failed = [s for s in report.steps if not s.ok]
    assert [(s.name, s.code) for s in failed] == [
        ("python and gateway from inside", "PROVIDER_CHECK_FAILED")]
    assert "could not reach http://127.0.0.1:1/healthz" in failed[0].detail
    assert report.steps[-1].name == "delete" and report.steps[-1].ok
    assert prov.list({}) == []


def test_check_without_the_sdk_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.sandbox import providers

    monkeypatch.setitem(providers.REMOTE, "daytona", providers.RemoteEntry(
        "tasks.sandbox.providers.daytona", "DaytonaProvider", "daytona", "no_such_sdk_here",
        (("DAYTONA_API_KEY",),)))
    monkeypatch.setenv("PLAYRUN_SANDBOX_PROVIDER", "daytona")
    monkeypatch.setenv("PLAYRUN_GATEWAY_PUBLIC_URL", "https://gw.example.com")
    reset_settings()
    try:
        result = CliRunner().invoke(app, ["providers", "check"])
    finally:
        monkeypatch.undo()
        reset_settings()
    assert result.exit_code == 2
    assert result.output.splitlines()[0].startswith("FAIL credentials")
    assert "(error PROVIDER_EXTRA_MISSING)" in result.output
    assert "pip install 'playrun[daytona]'" in result.output


def test_list_shows_every_provider_and_the_configured_one() -> None:
    result = CliRunner().invoke(app, ["providers", "list"])
    assert result.exit_code == 0, result.output
    names = [line.split()[0] for line in result.output.splitlines()[1:]]
    assert names == ["local", "fake", "daytona", "e2b", "modal", "agentcore"]
    assert result.output.splitlines()[1].rstrip().endswith("yes")  # local, the default
