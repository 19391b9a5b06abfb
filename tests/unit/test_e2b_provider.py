"""What the E2B adapter does beyond the shared contract, against the loopback double:
E2B's two kinds of 429, its lifetime, egress, pagination, and the 60 s command deadline."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("e2b", reason="the e2b SDK is not installed (pip install 'playrun[e2b]')")

from e2b import E2B, TimeoutException

from tasks.sandbox import (
    CapacityUnavailableError,
    RateLimitedError,
    SandboxSpec,
    TransportError,
)
from tasks.sandbox.providers.e2b import E2BProvider, errors, provider
from tests.doubles.e2b_api import concurrency_message
from tests.doubles.e2b_double import E2BDouble, running


@pytest.fixture
def double(tmp_path: Path) -> Iterator[E2BDouble]:
    with running(tmp_path) as served:
        yield served


def spec(key: str = "", **labels: str) -> SandboxSpec:
    return SandboxSpec(labels={"playrun": "1", **labels}, key=key, lifetime_s=600.0)


def test_creates_over_the_rate_are_rate_limited_with_the_servers_wait(tmp_path: Path) -> None:
    with running(tmp_path, creates_per_min=2) as double:
        prov = double.provider(tmp_path / "root")
        prov.create(spec())
        prov.create(spec())
        with pytest.raises(RateLimitedError) as caught:
            prov.create(spec())
        assert caught.value.retry_after_s is not None
        assert 1 <= caught.value.retry_after_s <= 60
        assert (double.creates(), double.rejected_429()) == (2, 1)


def test_the_concurrency_cap_is_capacity_not_pacing(tmp_path: Path) -> None:
    with running(tmp_path, max_live=1) as double:
        prov = double.provider(tmp_path / "root")
        first = prov.create(spec())
        with pytest.raises(CapacityUnavailableError):
            prov.create(spec())
        prov.delete(first.sandbox_id)
        prov.create(spec())
        assert double.max_live_seen() == 1


def test_429_texts_and_hints_are_read_as_untrusted() -> None:
    busy = errors.from_status(429, concurrency_message(20))
    assert isinstance(busy, CapacityUnavailableError)
    assert isinstance(errors.from_status(429, ""), RateLimitedError)  # a body-less edge 429
    assert isinstance(errors.from_status(503, "no capacity"), CapacityUnavailableError)
    assert errors.retry_after({"retry-after": "7"}) == 7.0
    assert errors.retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert errors.retry_after({"retry-after": "99999999"}) == errors.MAX_RETRY_AFTER_S
    assert errors.body_fields(b"<html>" + b"x" * 10_000)[0].startswith("<html>")
    assert len(errors.body_fields(b"x" * 10_000)[0]) == errors.MAX_MESSAGE_CHARS


def test_the_lifetime_is_the_providers_and_egress_is_the_gateways_only(
    double: E2BDouble, tmp_path: Path
) -> None:
    prov = double.provider(tmp_path / "root")
    ref = prov.create(
        SandboxSpec(labels={"playrun": "1"}, lifetime_s=1.2, egress_hosts=("gw.example.com",))
    )
    box = double.world.box(ref.sandbox_id)
    assert box is not None
    assert box.network == {"allowOut": ["gw.example.com"], "denyOut": ["0.0.0.0/0"]}
    deadline = time.monotonic() + 10
    while ref.sandbox_id in double.sandboxes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ref.sandbox_id not in double.sandboxes()


def test_a_retry_with_other_labels_keeps_the_attempts_sandbox(
    double: E2BDouble, tmp_path: Path
) -> None:
    prov = double.provider(tmp_path / "root")
    first = prov.create(spec("pr-run9-1", **{"playrun.lease": "a"}))
    again = prov.create(spec("pr-run9-1", **{"playrun.lease": "b"}))
    assert again.sandbox_id == first.sandbox_id
    assert double.live_count() == 1


def test_list_follows_pages(
    double: E2BDouble, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(provider, "LIST_PAGE", 2)
    prov = double.provider(tmp_path / "root")
    made = {prov.create(spec(**{"playrun.run": "paged"})).sandbox_id for _ in range(5)}
    prov.create(spec(**{"playrun.run": "other"}))
    assert {ref.sandbox_id for ref in prov.list({"playrun.run": "paged"})} == made
    assert len(prov.list({})) == 6


def test_the_sdks_default_command_deadline_kills_and_ours_does_not(
    double: E2BDouble, tmp_path: Path
) -> None:
    prov = double.provider(tmp_path / "root")
    ref = prov.create(spec())
    sbx = E2B(**prov._params).Sandbox.connect(ref.sandbox_id)
    with pytest.raises(TimeoutException):  # what timeout=60 does to a runner, in 1 s
        sbx.commands.run("sleep 30", timeout=1)
    prov.exec_detached(
        ref.sandbox_id, ["{python}", "-c", "import time; time.sleep(30)"], env={}, timeout_s=60
    )
    starts = [ms for args, ms in double.world.started if "playrun_boot.py start" in args]
    assert starts == [None]  # no deadline went with the runner's start
    assert prov.poll(ref.sandbox_id).state == "running"


def test_an_unreachable_api_is_a_transport_error(tmp_path: Path) -> None:
    prov = E2BProvider(
        tmp_path,
        api_params={
            "api_key": "e2b_x",
            "api_url": "http://127.0.0.1:9",
            "sandbox_url": "http://127.0.0.1:9",
        },
        request_timeout_s=2,
    )
    with pytest.raises(TransportError):
        prov.create(spec())
