"""Choosing a cloud provider: coded refusals at start-up, what a remote runner is told,
and the runner's HTTPS line to a gateway on another network."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tasks.acquisition.sandbox import egress_for, runner_files, sandbox_key
from tasks.errors import ConfigurationError
from tasks.execution.launch import runner_env
from tasks.execution.runner_client import Gateway
from tasks.sandbox import get_provider, providers
from tasks.settings import Settings
from tasks.store.fence import Fence


def test_an_unknown_provider_is_refused_with_the_known_names(tmp_path: Path) -> None:
    with pytest.raises(providers.ProviderUnknownError) as caught:
        get_provider("nimbus", tmp_path)
    assert caught.value.code == "PROVIDER_UNKNOWN"
    assert "daytona" in caught.value.message and "local" in caught.value.message


def test_a_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(providers.REMOTE, "daytona", providers.RemoteEntry(
        "tasks.sandbox.providers.daytona", "DaytonaProvider", "daytona",
        "no_such_sdk_module_here", (("DAYTONA_API_KEY",),)))
    with pytest.raises(providers.ProviderExtraMissingError) as caught:
        providers.check_installed("daytona")
    assert caught.value.code == "PROVIDER_EXTRA_MISSING"
    assert "pip install 'playrun[daytona]'" in caught.value.message


def test_missing_credentials_name_the_variables_not_their_values() -> None:
    with pytest.raises(providers.ProviderCredentialsMissingError) as caught:
        providers.check_credentials("modal", {"MODAL_TOKEN_ID": "ak-123"})
    assert "MODAL_TOKEN_ID+MODAL_TOKEN_SECRET" in caught.value.message
    assert "ak-123" not in caught.value.message
    providers.check_credentials("modal", {"MODAL_TOKEN_ID": "a", "MODAL_TOKEN_SECRET": "b"})
    providers.check_credentials("e2b", {"E2B_API_KEY": "k"})


def test_a_remote_provider_needs_the_public_gateway_url() -> None:
    with pytest.raises(ConfigurationError, match="PLAYRUN_GATEWAY_PUBLIC_URL"):
        Settings(sandbox_provider="e2b").check()
    Settings(sandbox_provider="e2b", gateway_public_url="https://gw.example.com").check()


def test_a_remote_runner_gets_the_public_url_and_no_socket() -> None:
    fence = Fence("0123456789abcdef0123456789abcdef", 2, "lease")
    remote = Settings(sandbox_provider="daytona", gateway_public_url="https://gw.example.com/p")
    env = runner_env(fence, "acme", "launch", remote)
    assert (env["PLAYRUN_GATEWAY_URL"], env["PLAYRUN_GATEWAY_SOCKET"]) == \
        ("https://gw.example.com/p", "")
    local = runner_env(fence, "acme", "launch", Settings())
    assert local["PLAYRUN_GATEWAY_URL"] == Settings().gateway_url
    assert local["PLAYRUN_GATEWAY_SOCKET"]


def test_one_key_per_attempt_and_egress_to_the_gateway_only() -> None:
    assert sandbox_key(Fence("ABCdef", 3, "x")) == "pr-abcdef-3"
    # A start tried again after its sandbox was released asks for a new one.
    assert sandbox_key(Fence("ABCdef", 3, "x"), 2) == "pr-abcdef-3-2"
    assert len(sandbox_key(Fence("f" * 200, 10**6, "x"))) <= 63
    gated = Settings(gateway_public_url="https://gw.example.com:8443/p")
    assert egress_for(gated) == ("gw.example.com",)
    assert egress_for(Settings(gateway_public_url="https://gw.example.com",
                               sandbox_egress="open")) is None
    assert egress_for(Settings()) is None


def test_the_fleet_label_is_a_short_slug() -> None:
    with pytest.raises(ValueError):
        Settings(fleet="Prod Fleet!")
    assert Settings(fleet="prod-eu").fleet == "prod-eu"


@pytest.fixture
def tls_server(tmp_path: Path) -> tuple[str, Path, list[bytes]]:
    """An HTTPS listener for localhost with a certificate of its own making."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            tls = context.wrap_socket(conn, server_side=True)
        except ssl.SSLError:
            return  # the client refused our certificate
        with tls:
            data = b""
            while b"\r\n\r\n" not in data:
                data += tls.recv(65536)
            seen.append(data)
            body = json.dumps({"result": {"ok": True}}).encode()
            tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    threading.Thread(target=serve, daemon=True).start()
    return f"https://localhost:{listener.getsockname()[1]}/edge", cert, seen


def test_the_runner_speaks_https_to_a_gateway_it_can_verify(
        tls_server: tuple[str, Path, list[bytes]], tmp_path: Path) -> None:
    url, cert, seen = tls_server
    for name, data in runner_files().items():  # the files as a sandbox gets them
        (tmp_path / name).write_bytes(data)
    # The runner is a separate process in a sandbox: SSL_CERT_FILE is how it trusts a CA.
    code = ("import playrun_client as c; "
            f"print(c.Gateway({url!r}, None).call('tok', {{'action': 'x'}}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30, cwd=tmp_path,
                          env={"SSL_CERT_FILE": str(cert), "PATH": "/usr/bin"})
    assert done.stdout.strip() == "{'ok': True}", done.stderr
    head = seen[0].decode()
    assert head.startswith("POST /edge/v1/runtime HTTP/1.1")
    assert "Host: localhost:" in head


def test_the_runner_refuses_a_gateway_it_cannot_verify(
        tls_server: tuple[str, Path, list[bytes]]) -> None:
    url, _cert, _seen = tls_server
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED|certificate verify"):
        Gateway(url, None).call("tok", {"action": "x"})
