"""The Daytona adapter against the loopback Daytona: what a create asks of the API, the
double's own limits as the SDK meets them, and every SDK error as a playrun kind."""

from __future__ import annotations

import email.utils
import time
from pathlib import Path

import pytest

pytest.importorskip("daytona")

import httpx
from daytona import (
    DaytonaBadRequestError,
    DaytonaConflictError,
    DaytonaError,
    DaytonaNotFoundError,
    DaytonaQueueTimeoutError,
    DaytonaRateLimitError,
)
from daytona.common.errors import (
    DaytonaConnectionTimeoutError,
    DaytonaServiceUnavailableError,
)

from tasks.sandbox import (
    CapacityUnavailableError,
    ProviderAuthError,
    ProviderError,
    RateLimitedError,
    SandboxSpec,
)
from tasks.sandbox.providers.daytona import DaytonaProvider
from tasks.sandbox.providers.daytona.errors import translate
from tasks.sandbox.providers.daytona.provider import egress_params
from tests.doubles.daytona_double import running


def spec(key: str = "", **kw: object) -> SandboxSpec:
    return SandboxSpec(labels={"playrun": "1", "playrun.run": "r"}, key=key, **kw)  # type: ignore[arg-type]


def test_a_create_asks_for_an_ephemeral_sandbox_with_a_hard_lifetime(tmp_path: Path) -> None:
    with running(tmp_path) as double:
        provider = double.provider(tmp_path)
        provider.create(spec("pr-life-1", lifetime_s=3601.0, egress_hosts=("gw.example.com",)))
        sent = double.created_with("pr-life-1")
    assert sent["autoStopInterval"] == 0  # auto-stop counts API calls, not the runner's work
    assert sent["ttlMinutes"] == 61
    assert sent["autoDeleteInterval"] == 0  # ephemeral: deleted once stopped
    assert sent["domainAllowList"] == "gw.example.com"
    assert sent["labels"]["playrun.run"] == "r"


def test_egress_goes_to_the_list_daytona_has_for_each_kind_of_host() -> None:
    assert egress_params(None) == {}
    assert egress_params(()) == {"network_block_all": True}
    assert egress_params(("203.0.113.7", "gw.example.com")) == {
        "network_allow_list": "203.0.113.7/32",
        "domain_allow_list": "gw.example.com",
    }
    # IPv6 has no allow list: blocking the rest would block the gateway too.
    assert egress_params(("2001:db8::1",)) == {}


def test_a_create_over_the_rate_gets_the_throttlers_own_wait(tmp_path: Path) -> None:
    with running(tmp_path, creates_per_min=2) as double:
        provider = double.provider(tmp_path)
        provider.create(spec())
        provider.create(spec())
        with pytest.raises(RateLimitedError) as caught:
            provider.create(spec())
        assert 55 <= (caught.value.retry_after_s or 0) <= 60
        assert (double.creates(), double.rejected_429(), double.live_count()) == (2, 1, 2)


def test_a_full_org_is_capacity_unavailable_until_a_sandbox_goes(tmp_path: Path) -> None:
    with running(tmp_path, max_live=1) as double:
        provider = double.provider(tmp_path)
        first = provider.create(spec())
        with pytest.raises(CapacityUnavailableError, match="Total CPU limit exceeded"):
            provider.create(spec())
        provider.delete(first.sandbox_id)
        provider.create(spec())
        assert double.max_live_seen() == 1


def test_a_slow_start_is_waited_for_and_a_retry_adopts_it_started(tmp_path: Path) -> None:
    with running(tmp_path, create_latency_s=1.0) as double:
        provider = double.provider(tmp_path)
        started = time.monotonic()
        ref = provider.create(spec("pr-slow-1"))
        assert time.monotonic() - started >= 1.0
        assert provider.poll(ref.sandbox_id).state == "never_started"
        double.create_after_timeout()
        with pytest.raises(ProviderError, match="lost its answer"):
            provider.create(spec("pr-slow-2"))
        adopted = provider.create(spec("pr-slow-2"))  # still starting when found
        assert provider.poll(adopted.sandbox_id).state == "never_started"
        assert double.live_count() == 2


def test_a_read_from_an_offset_is_bounded_and_paths_stay_in_the_workdir(
    tmp_path: Path,
) -> None:
    with running(tmp_path) as double:
        provider = double.provider(tmp_path)
        ref = provider.create(SandboxSpec(labels={}, files={"f.txt": b"0123456789"}))
        found = provider.read_file(ref.sandbox_id, "f.txt", offset=5, max_bytes=3)
        assert found is not None
        assert (found.data, found.size, found.truncated) == (b"567", 10, True)
        tail = provider.read_file(ref.sandbox_id, "f.txt", offset=8, max_bytes=100)
        assert tail is not None and (tail.data, tail.truncated) == (b"89", False)
        for path in ("../outside", "/etc/passwd"):
            with pytest.raises(ProviderError, match="not inside"):
                provider.read_file(ref.sandbox_id, path, max_bytes=10)


def test_no_credentials_is_an_auth_error_not_an_sdk_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)  # the SDK also reads a .env in the working directory
    with pytest.raises(ProviderAuthError):
        DaytonaProvider(tmp_path).list({})


def test_a_wrong_key_is_an_auth_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running(tmp_path) as double:
        monkeypatch.setenv("DAYTONA_API_URL", double.env["DAYTONA_API_URL"])
        monkeypatch.setenv("DAYTONA_API_KEY", "not-the-key")
        with pytest.raises(ProviderAuthError):
            DaytonaProvider(tmp_path).create(spec())


def _date(seconds_ahead: float) -> str:
    return email.utils.formatdate(time.time() + seconds_ahead, usegmt=True)


@pytest.mark.parametrize(
    ("exc", "kind", "after"),
    [
        (
            DaytonaRateLimitError(
                "x", 429, {"Retry-After-sandbox-create": "12", "Retry-After": "3"}
            ),
            "rate_limited",
            12.0,
        ),
        (DaytonaRateLimitError("x", 429, {"retry-after": "4"}), "rate_limited", 4.0),
        (DaytonaRateLimitError("x", 429, {"Retry-After": _date(600)}), "rate_limited", 600.0),
        (DaytonaRateLimitError("x", 429, {"Retry-After": "soon"}), "rate_limited", None),
        (DaytonaRateLimitError("x", 429, {"Retry-After": "999999"}), "rate_limited", 3600.0),
        (
            DaytonaBadRequestError("Failed to create sandbox: No available runners", 400),
            "capacity_unavailable",
            None,
        ),
        (
            DaytonaBadRequestError("Total memory limit exceeded. Maximum allowed: 20GiB.", 400),
            "capacity_unavailable",
            None,
        ),
        (DaytonaBadRequestError("Invalid snapshot name", 400), "other", None),
        (DaytonaQueueTimeoutError("waited 5 minutes for a runner"), "capacity_unavailable", None),
        (DaytonaNotFoundError("no sandbox", 404), "not_found", None),
        (DaytonaConflictError("exists", 409), "other", None),
        (DaytonaConnectionTimeoutError("read timed out"), "transport", None),
        (DaytonaServiceUnavailableError("busy", 503, {"Retry-After": "9"}), "transport", 9.0),
        (DaytonaError("Function 'create' exceeded timeout"), "other", None),
        (httpx.ConnectError("refused"), "transport", None),
        (
            httpx.HTTPStatusError(
                "429",
                request=httpx.Request("GET", "http://x"),
                response=httpx.Response(429, headers={"Retry-After": "5"}),
            ),
            "rate_limited",
            5.0,
        ),
        (ValueError("a bug"), "other", None),
    ],
)
def test_every_sdk_error_maps_to_a_kind_with_the_servers_hint(
    exc: BaseException, kind: str, after: float | None
) -> None:
    mapped = translate(exc)
    assert mapped.kind == kind
    assert mapped.retry_after_s == (pytest.approx(after, rel=0.1) if after else None)
