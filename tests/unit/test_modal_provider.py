"""What the Modal adapter adds to the provider contract, against the loopback double:
server-side limits reach playrun at once, egress follows the gateway's host, labels that
Modal tags cannot hold survive, and a sandbox's lifetime is Modal's to enforce."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("modal")

import modal.exception as mx
from grpclib import GRPCError, Status
from grpclib.exceptions import StreamTerminatedError
from modal_proto import api_pb2

from tasks.sandbox import (
    CapacityUnavailableError,
    ProviderAuthError,
    RateLimitedError,
    SandboxNotFoundError,
    SandboxSpec,
    TransportError,
)
from tasks.sandbox.providers.modal import ModalProvider
from tasks.sandbox.providers.modal.errors import mapped
from tasks.sandbox.providers.modal.tags import decode, encode, sandbox_name
from tests.doubles.modal_double import ModalDouble, running

NetworkType = api_pb2.NetworkAccess.NetworkAccessType


def spec(**kw: object) -> SandboxSpec:
    base: dict[str, object] = {"labels": {"playrun": "1"}, "lifetime_s": 600.0}
    return SandboxSpec(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture
def double(tmp_path: Path) -> Iterator[ModalDouble]:
    with running(tmp_path, creates_per_min=2, max_live=3) as found:
        yield found


def test_a_rate_limit_reaches_playrun_at_once_with_the_servers_hint(
    double: ModalDouble, tmp_path: Path
) -> None:
    provider = double.provider(tmp_path)
    made = [provider.create(spec()) for _ in range(2)]
    started = time.monotonic()
    with pytest.raises(RateLimitedError) as caught:
        provider.create(spec())
    assert time.monotonic() - started < 5  # the SDK did not sleep through the hint itself
    assert caught.value.retry_after_s is not None and 50 < caught.value.retry_after_s <= 60
    assert double.rejected_429() == 1
    for ref in made:
        provider.delete(ref.sandbox_id)


def test_the_accounts_sandbox_limit_is_capacity(tmp_path: Path) -> None:
    with running(tmp_path, max_live=1) as double:
        provider = double.provider(tmp_path)
        ref = provider.create(spec())
        with pytest.raises(CapacityUnavailableError):
            provider.create(spec())
        assert double.max_live_seen() == 1
        provider.delete(ref.sandbox_id)
        provider.delete(provider.create(spec()).sandbox_id)


@pytest.mark.parametrize(
    ("hosts", "kind", "cidrs", "domains"),
    [
        (None, NetworkType.OPEN, [], []),
        (("gw.example.com",), NetworkType.ALLOWLIST, [], ["gw.example.com"]),
        (("203.0.113.7",), NetworkType.ALLOWLIST, ["203.0.113.7/32"], []),
        ((), NetworkType.ALLOWLIST, [], []),
    ],
)
def test_egress_is_limited_to_the_gateways_host(
    double: ModalDouble,
    tmp_path: Path,
    hosts: tuple[str, ...] | None,
    kind: int,
    cidrs: list[str],
    domains: list[str],
) -> None:
    provider = double.provider(tmp_path)
    ref = provider.create(spec(egress_hosts=hosts))
    network = double.network(ref.sandbox_id)
    assert (
        network.network_access_type,
        list(network.allowed_cidrs),
        list(network.allowed_domains),
    ) == (kind, cidrs, domains)
    provider.delete(ref.sandbox_id)


def test_labels_modal_tags_cannot_hold_still_list_and_read_back(
    double: ModalDouble, tmp_path: Path
) -> None:
    provider = double.provider(tmp_path)
    odd = {"playrun": "1", "playrun.org": "Acme Corp / EU", "playrun.lease": "x" * 80}
    ref = provider.create(spec(labels=odd))
    found = provider.list({"playrun.org": "Acme Corp / EU"})
    assert [r.sandbox_id for r in found] == [ref.sandbox_id]
    assert found[0].labels["playrun.org"] == "Acme Corp / EU"
    assert abs(found[0].created_at - ref.created_at) < 1
    assert provider.list({"playrun.org": "Acme Corp"}) == []
    provider.delete(ref.sandbox_id)


def test_the_lifetime_is_enforced_by_modal(double: ModalDouble, tmp_path: Path) -> None:
    provider = double.provider(tmp_path)
    ref = provider.create(spec(lifetime_s=1.0))
    provider.exec_detached(
        ref.sandbox_id, ["{python}", "-c", "import time; time.sleep(60)"], env={}, timeout_s=60
    )
    deadline = time.monotonic() + 30
    while (status := provider.poll(ref.sandbox_id)).state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert (status.state, status.timed_out) == ("missing", True)
    with pytest.raises(SandboxNotFoundError):
        provider.read_file(ref.sandbox_id, "result.json", max_bytes=100)
    assert provider.list({"playrun": "1"}) == []


def test_a_finished_runner_stays_readable_until_deleted(
    double: ModalDouble, tmp_path: Path
) -> None:
    provider = double.provider(tmp_path)
    ref = provider.create(spec())
    provider.exec_detached(
        ref.sandbox_id, ["{python}", "-c", "open('r.txt', 'w').write('ok')"], env={}, timeout_s=60
    )
    deadline = time.monotonic() + 30
    while provider.poll(ref.sandbox_id).state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert provider.poll(ref.sandbox_id).exit_code == 0
    found = provider.read_file(ref.sandbox_id, "r.txt", max_bytes=10)
    assert found is not None and found.data == b"ok"
    assert [r.sandbox_id for r in provider.list({"playrun": "1"})] == [ref.sandbox_id]
    provider.delete(ref.sandbox_id)


def test_wrong_credentials_are_an_auth_error(double: ModalDouble, tmp_path: Path) -> None:
    provider = ModalProvider(tmp_path, environ={**double.env, "MODAL_TOKEN_SECRET": "nope"})
    with pytest.raises(ProviderAuthError):
        provider.create(spec())


def test_a_path_outside_the_workdir_is_refused(double: ModalDouble, tmp_path: Path) -> None:
    provider = double.provider(tmp_path)
    ref = provider.create(spec())
    for path in ("/etc/passwd", "../x", "a/../../x"):
        with pytest.raises(Exception, match="relative to its workdir"):
            provider.read_file(ref.sandbox_id, path, max_bytes=10)
    provider.delete(ref.sandbox_id)


def _sdk_error(cls: type[mx.Error], message: str, *details: object) -> mx.Error:
    exc = cls(message)
    exc._grpc_message = message  # type: ignore[attr-defined]
    exc._grpc_details = list(details)  # type: ignore[attr-defined]
    return exc


def test_each_sdk_failure_has_its_kind() -> None:
    hint = api_pb2.RPCRetryPolicy(retry_after_secs=4.5)
    rate = mapped(
        _sdk_error(mx.ResourceExhaustedError, "Sandbox creation rate limit exceeded", hint),
        "create",
    )
    assert (rate.kind, rate.retry_after_s) == ("rate_limited", 4.5)
    full = mapped(
        _sdk_error(mx.ResourceExhaustedError, "Insufficient capacity to create sandbox."), "create"
    )
    assert (full.kind, full.retry_after_s) == ("capacity_unavailable", None)
    assert mapped(mx.NotFoundError("The Sandbox is unavailable."), "poll").kind == "not_found"
    assert mapped(mx.AuthError("bad token"), "create").kind == "auth"
    assert isinstance(mapped(StreamTerminatedError("lost"), "create"), TransportError)
    assert mapped(GRPCError(Status.UNAVAILABLE, "down"), "create").kind == "transport"
    assert mapped(mx.InvalidError("bad arg"), "create").kind == "other"
    assert mapped(ValueError("surprise"), "create").kind == "other"


def test_tags_and_names_fit_modals_rules() -> None:
    for value in ("1", "pr-abc-1", "Acme Corp / EU", "_b.looks-encoded", "é" * 40, "x" * 100):
        tag = encode(value)
        assert 1 <= len(tag) <= 63 and all(c.isalnum() or c in "._-" for c in tag)
        if len(value) < 40:
            assert decode(tag) == value
    assert sandbox_name("pr-abc-1") == "pr-abc-1"
    assert sandbox_name("") is None
    assert sandbox_name("has space") == sandbox_name("has space")


def test_a_list_longer_than_a_page_is_whole(tmp_path: Path) -> None:
    with running(tmp_path) as double:
        provider = double.provider(tmp_path)
        made = {
            provider.create(spec(labels={"playrun": "1", "n": str(i)})).sandbox_id
            for i in range(double.world.page_size * 2 + 1)
        }
        assert {r.sandbox_id for r in provider.list({"playrun": "1"})} == made
        for sandbox_id in made:
            provider.delete(sandbox_id)
        assert provider.list({"playrun": "1"}) == []
