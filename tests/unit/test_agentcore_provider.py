"""What the AgentCore adapter adds to the shared contract, against its loopback double:
labels in session names, a create token per key, hard lifetimes, the service's pushback."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("boto3")

from tasks.constants import (
    LABEL_FLEET,
    LABEL_GENERATION,
    LABEL_LEASE,
    LABEL_MANAGED,
    LABEL_ORG,
    LABEL_RUN,
)
from tasks.sandbox import (
    CapacityUnavailableError,
    ProviderAuthError,
    RateLimitedError,
    SandboxNotFoundError,
    SandboxSpec,
    TransportError,
)
from tasks.sandbox.providers.agentcore import AgentCoreProvider
from tasks.sandbox.providers.agentcore.naming import MAX_NAME, session_name
from tests.doubles.agentcore_double import AgentCoreDouble, running
from tests.doubles.agentcore_wire import throttled
from tests.support.helpers import eventually


@pytest.fixture
def double(tmp_path: Path) -> Iterator[AgentCoreDouble]:
    with running(tmp_path) as served:
        yield served


@pytest.fixture
def provider(double: AgentCoreDouble, tmp_path: Path) -> AgentCoreProvider:
    return double.provider(tmp_path / "root")  # type: ignore[no-any-return]


def labels(**extra: str) -> dict[str, str]:
    return {
        LABEL_MANAGED: "1",
        LABEL_RUN: uuid.uuid4().hex,
        LABEL_GENERATION: "3",
        LABEL_ORG: "acme",
        LABEL_FLEET: "default",
        LABEL_LEASE: uuid.uuid4().hex,
        **extra,
    }


def test_playrun_labels_fit_a_session_name_and_list_back_whole(
    provider: AgentCoreProvider, double: AgentCoreDouble
) -> None:
    mine = labels()
    ref = provider.create(SandboxSpec(labels=mine, key="pr-a-3"))
    names = [s.name for s in double.state.sessions.values()]
    assert len(names[0]) <= MAX_NAME
    found = provider.list({LABEL_MANAGED: "1", LABEL_LEASE: mine[LABEL_LEASE]})
    assert [(r.sandbox_id, dict(r.labels)) for r in found] == [(ref.sandbox_id, mine)]
    assert provider.list({LABEL_LEASE: uuid.uuid4().hex}) == []


def test_labels_too_long_for_a_name_are_read_back_from_the_sandbox(
    provider: AgentCoreProvider,
) -> None:
    long = labels(
        **{
            LABEL_ORG: "org/" + "o" * 124,
            LABEL_FLEET: "f" * 40,
            "team.owner": "someone with spaces",
        }
    )
    assert len(session_name("t" * 40, long)) <= MAX_NAME
    ref = provider.create(SandboxSpec(labels=long, key="pr-long-1"))
    other = provider.create(SandboxSpec(labels=labels(), key="pr-other-1"))
    found = provider.list({LABEL_MANAGED: "1"})
    assert {r.sandbox_id: dict(r.labels) for r in found}[ref.sandbox_id] == long
    assert [r.sandbox_id for r in provider.list({"team.owner": "someone with spaces"})] == [
        ref.sandbox_id
    ]
    assert [r.sandbox_id for r in provider.list({LABEL_ORG: "acme"})] == [other.sandbox_id]


def test_the_same_key_with_a_new_lease_adopts_the_first_sandbox(
    provider: AgentCoreProvider, double: AgentCoreDouble
) -> None:
    first = provider.create(SandboxSpec(labels=labels(), key="pr-lease-1", lifetime_s=600))
    again = provider.create(SandboxSpec(labels=labels(), key="pr-lease-1", lifetime_s=600))
    assert again.sandbox_id == first.sandbox_id
    assert double.creates() == 1


def test_a_listing_follows_every_page(provider: AgentCoreProvider, double: AgentCoreDouble) -> None:
    double.state.page_size = 2
    made = {
        provider.create(SandboxSpec(labels=labels(), key=f"pr-page-{i}")).sandbox_id
        for i in range(5)
    }
    assert {r.sandbox_id for r in provider.list({LABEL_MANAGED: "1"})} == made


def test_the_session_timeout_is_the_sandboxs_hard_lifetime(
    provider: AgentCoreProvider, double: AgentCoreDouble
) -> None:
    ref = provider.create(SandboxSpec(labels=labels(), key="pr-short-1", lifetime_s=0.5))
    provider.exec_detached(
        ref.sandbox_id, ["{python}", "-c", "import time; time.sleep(60)"], env={}, timeout_s=120
    )
    eventually(lambda: double.live_count() == 0, what="the session to expire")
    with pytest.raises(SandboxNotFoundError):
        provider.poll(ref.sandbox_id)
    assert provider.list({LABEL_MANAGED: "1"}) == []
    provider.delete(ref.sandbox_id)


def test_a_file_read_is_binary_safe_from_an_offset(provider: AgentCoreProvider) -> None:
    ref = provider.create(SandboxSpec(labels=labels(), files={"blob.bin": bytes(range(256))}))
    found = provider.read_file(ref.sandbox_id, "blob.bin", offset=250, max_bytes=100)
    assert found is not None
    assert (found.data, found.size, found.truncated) == (bytes(range(250, 256)), 256, False)
    with pytest.raises(Exception, match="relative"):
        provider.read_file(ref.sandbox_id, "../escape", max_bytes=10)


def test_one_throttle_is_one_error_botocore_does_not_retry(
    provider: AgentCoreProvider, double: AgentCoreDouble
) -> None:
    double.push_back("rate_limited", retry_after_s=4.0, times=2)
    for _ in range(2):
        with pytest.raises(RateLimitedError) as caught:
            provider.create(SandboxSpec(labels=labels()))
        assert caught.value.retry_after_s == pytest.approx(4.0)
    assert (double.rejected_429(), double.creates()) == (2, 0)


def test_the_create_rate_and_the_session_quota_answer_as_the_service_does(tmp_path: Path) -> None:
    with running(tmp_path, creates_per_min=2, max_live=3) as double:
        provider = double.provider(tmp_path / "root")
        for _ in range(2):
            provider.create(SandboxSpec(labels=labels()))
        with pytest.raises(RateLimitedError) as caught:
            provider.create(SandboxSpec(labels=labels()))
        assert caught.value.retry_after_s is not None
        assert 0 < caught.value.retry_after_s <= 60
    with running(tmp_path / "quota", max_live=1) as double:
        provider = double.provider(tmp_path / "root")
        provider.create(SandboxSpec(labels=labels()))
        with pytest.raises(CapacityUnavailableError):
            provider.create(SandboxSpec(labels=labels()))
        assert double.max_live_seen() == 1


def test_an_error_inside_a_tool_answer_is_mapped(
    provider: AgentCoreProvider, double: AgentCoreDouble
) -> None:
    ref = provider.create(SandboxSpec(labels=labels()))
    double.fail_invoke(throttled(None))
    with pytest.raises(RateLimitedError):
        provider.poll(ref.sandbox_id)
    assert provider.poll(ref.sandbox_id).state == "never_started"


def test_an_unreachable_service_is_a_transport_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running(tmp_path) as double:
        url = double.url
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", url)  # nothing listens now
    for key, value in double.env.items():
        if key != "AWS_ENDPOINT_URL_BEDROCK_AGENTCORE":
            monkeypatch.setenv(key, value)
    with pytest.raises(TransportError):
        AgentCoreProvider(tmp_path / "root").create(SandboxSpec(labels=labels()))


def test_no_credentials_is_an_auth_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running(tmp_path) as double:
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        with pytest.raises(ProviderAuthError):
            double.provider(tmp_path / "root").create(SandboxSpec(labels=labels()))
