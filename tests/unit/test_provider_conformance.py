"""Every sandbox provider keeps the same contract: local, and each cloud provider's
real SDK against its loopback double (tests/doubles/<name>_double.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.sandbox import (
    CapacityUnavailableError,
    ExitReport,
    ExitReporting,
    ProcessStatus,
    ProviderAuthError,
    ProviderError,
    RateLimitedError,
    SandboxNotFoundError,
    SandboxProvider,
    SandboxSpec,
)
from tasks.sandbox.providers import REMOTE
from tests.doubles.base import Double, discover
from tests.support.exit_gateway import PROBE, StubGateway
from tests.support.helpers import eventually

DOUBLES = discover()


@pytest.fixture(params=sorted(DOUBLES))
def double(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Double]:
    name = request.param
    if name in REMOTE and importlib.util.find_spec(REMOTE[name].sdk) is None:
        pytest.skip(f"the {name} SDK is not installed (pip install 'playrun[{name}]')")
    with DOUBLES[name](tmp_path) as running:
        yield running


@pytest.fixture
def provider(double: Double, tmp_path: Path) -> SandboxProvider:
    return double.provider(tmp_path / "root")


def spec(key: str = "", **labels: str) -> SandboxSpec:
    return SandboxSpec(labels={"playrun": "1", "playrun.fleet": "conformance", **labels},
                       files={"data.txt": b"uploaded at create\n"}, key=key, lifetime_s=600.0)


def settle(provider: SandboxProvider, sandbox_id: str, within: float = 30.0) -> ProcessStatus:
    deadline = time.monotonic() + within
    while True:
        status = provider.poll(sandbox_id)
        if status.state != "running" or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def run(provider: SandboxProvider, sandbox_id: str, code: str,
        env: dict[str, str] | None = None) -> ProcessStatus:
    provider.exec_detached(sandbox_id, ["{python}", "-c", code], env=env or {}, timeout_s=60)
    return settle(provider, sandbox_id)


def test_a_created_sandbox_is_listed_by_its_labels(provider: SandboxProvider) -> None:
    ref = provider.create(spec(**{"playrun.run": "r1"}))
    assert ref.labels["playrun.run"] == "r1"
    assert ref.created_at > time.time() - 300
    found = provider.list({"playrun.run": "r1"})
    assert [r.sandbox_id for r in found] == [ref.sandbox_id]
    assert found[0].labels["playrun.fleet"] == "conformance"
    assert provider.list({"playrun.run": "someone-else"}) == []
    provider.delete(ref.sandbox_id)


def test_the_same_key_gives_the_same_sandbox(provider: SandboxProvider, double: Double) -> None:
    first = provider.create(spec("pr-run1-1", **{"playrun.run": "run1"}))
    again = provider.create(spec("pr-run1-1", **{"playrun.run": "run1"}))
    assert again.sandbox_id == first.sandbox_id
    assert [r.sandbox_id for r in provider.list({"playrun.run": "run1"})] == [first.sandbox_id]
    other = provider.create(spec("pr-run1-2", **{"playrun.run": "run1"}))
    assert other.sandbox_id != first.sandbox_id
    for sandbox_id in {first.sandbox_id, other.sandbox_id}:
        provider.delete(sandbox_id)


def test_a_fresh_sandbox_has_never_started_a_process(provider: SandboxProvider) -> None:
    ref = provider.create(spec())
    assert provider.poll(ref.sandbox_id).state == "never_started"
    provider.delete(ref.sandbox_id)


def test_a_detached_command_gets_its_env_and_the_uploaded_files(
        provider: SandboxProvider) -> None:
    ref = provider.create(spec())
    status = run(provider, ref.sandbox_id,
                 "import os; open('out.txt', 'w').write(os.environ['GREETING'] + ' / ' "
                 "+ open('data.txt').read().strip()); raise SystemExit(3)",
                 env={"GREETING": "hello"})
    assert (status.state, status.exit_code) == ("exited", 3)
    found = provider.read_file(ref.sandbox_id, "out.txt", max_bytes=1000)
    assert found is not None
    assert found.data == b"hello / uploaded at create"
    assert not found.truncated
    provider.delete(ref.sandbox_id)


def test_exec_returns_while_the_command_runs(provider: SandboxProvider) -> None:
    ref = provider.create(spec())
    started = time.monotonic()
    provider.exec_detached(ref.sandbox_id, ["{python}", "-c", "import time; time.sleep(60)"],
                           env={}, timeout_s=120)
    assert time.monotonic() - started < 30
    assert provider.poll(ref.sandbox_id).state == "running"
    provider.delete(ref.sandbox_id)


def test_a_killed_runner_is_not_running(provider: SandboxProvider, double: Double) -> None:
    ref = provider.create(spec())
    provider.exec_detached(ref.sandbox_id, ["{python}", "-c", "import time; time.sleep(60)"],
                           env={}, timeout_s=120)
    double.kill_runner(ref.sandbox_id)
    try:
        status = settle(provider, ref.sandbox_id)
    except SandboxNotFoundError:
        status = ProcessStatus(state="missing")  # the sandbox went with its entrypoint
    assert status.state in ("missing", "exited")
    assert status.exit_code != 0
    provider.delete(ref.sandbox_id)


def test_a_file_read_is_bounded(provider: SandboxProvider) -> None:
    ref = provider.create(spec())
    assert run(provider, ref.sandbox_id,
               "open('big.bin', 'wb').write(b'x' * 10240)").exit_code == 0
    found = provider.read_file(ref.sandbox_id, "big.bin", max_bytes=100)
    assert found is not None
    assert (len(found.data), found.size, found.truncated) == (100, 10240, True)
    assert provider.read_file(ref.sandbox_id, "absent.txt", max_bytes=100) is None
    provider.delete(ref.sandbox_id)


def test_delete_is_final_and_repeatable(provider: SandboxProvider) -> None:
    ref = provider.create(spec(**{"playrun.run": "gone"}))
    provider.delete(ref.sandbox_id)
    provider.delete(ref.sandbox_id)  # not found is success
    assert provider.list({"playrun.run": "gone"}) == []
    with contextlib.suppress(SandboxNotFoundError):
        assert provider.poll(ref.sandbox_id).state in ("missing", "never_started")


@pytest.mark.parametrize(("kind", "error"), [
    ("rate_limited", RateLimitedError),
    ("capacity_unavailable", CapacityUnavailableError),
    ("auth", ProviderAuthError),
])
def test_pushback_maps_to_its_kind(provider: SandboxProvider, double: Double, kind: str,
                                   error: type[ProviderError]) -> None:
    if not double.pushback:
        pytest.skip(f"{double.name} has no server to push back")
    double.push_back(kind, retry_after_s=7.0)  # type: ignore[arg-type]
    with pytest.raises(error) as caught:
        provider.create(spec())
    assert caught.value.kind == kind
    if kind == "rate_limited":
        assert caught.value.retry_after_s == pytest.approx(7.0, abs=1.0)
    assert double.live_count() == 0
    ref = provider.create(spec())  # the next create is served again
    provider.delete(ref.sandbox_id)


def test_a_create_whose_answer_was_lost_is_found_by_its_key(
        provider: SandboxProvider, double: Double) -> None:
    if not double.pushback:
        pytest.skip(f"{double.name} has no answer to lose")
    double.create_after_timeout()
    with pytest.raises(ProviderError):
        provider.create(spec("pr-lost-1", **{"playrun.run": "lost"}))
    ref = provider.create(spec("pr-lost-1", **{"playrun.run": "lost"}))
    assert double.live_count() == 1
    assert [r.sandbox_id for r in provider.list({"playrun.run": "lost"})] == [ref.sandbox_id]
    provider.delete(ref.sandbox_id)
    assert double.live_count() == 0


def test_the_runner_s_exit_is_reported_with_a_token_it_never_sees(
        provider: SandboxProvider, tmp_path: Path) -> None:
    assert isinstance(provider, ExitReporting) and provider.reports_exit
    gateway = StubGateway()
    token = "exit-" + secrets.token_hex(16)
    try:
        ref = provider.create(spec())
        provider.exec_detached(ref.sandbox_id, ["{python}", "-c", PROBE],
                               env={"PLAYRUN_TOKEN": "runner-token"}, timeout_s=60,
                               report=ExitReport(token, gateway.url, ""))
        eventually(lambda: gateway.requests, what="the exit report")
        headers, body = gateway.requests[0]
        assert headers["authorization"] == f"Bearer {token}"
        assert json.loads(body) == {"action": "exited", "status": 5, "signal": None,
                                    "result_present": True}
        assert settle(provider, ref.sandbox_id) == ProcessStatus("exited", 5, False)
        seen = provider.read_file(ref.sandbox_id, "seen.txt", max_bytes=32 << 20)
        assert seen is not None and not seen.truncated
        assert b"runner-token" in seen.data  # the probe did read its environment
        assert token.encode() not in seen.data
        for path in tmp_path.rglob("*"):  # every double keeps its sandboxes under tmp_path
            if path.is_file() and not path.is_symlink():
                assert token.encode() not in path.read_bytes(), path
        assert len(gateway.requests) == 1
        provider.delete(ref.sandbox_id)
    finally:
        gateway.close()
