"""Per-attempt budgets at the gateway: one attempt's flood is answered 429 with Retry-After,
other attempts go on untouched, and the runner's client waits and sends the same request."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tasks.errors import GatewayRateLimitedError
from tasks.execution import runner_client
from tasks.gateway.budgets import Budgets
from tasks.host.processes import free_port
from tests.support.gateway import call, launched, refused
from tests.support.stack import Gateway, worker_env


def budgets() -> Budgets:
    return Budgets(requests_per_s=10, request_burst=5, bytes_per_s=1000, byte_burst=2000,
                   max_in_flight=2)


def test_a_burst_then_the_rate_and_other_attempts_are_untouched() -> None:
    b = budgets()
    for _ in range(5):
        b.admit(("a", 1), 10, now=0.0)
        b.release(("a", 1))
    with pytest.raises(GatewayRateLimitedError) as caught:
        b.admit(("a", 1), 10, now=0.0)
    assert caught.value.retry_after_s == pytest.approx(0.1)
    b.admit(("b", 1), 10, now=0.0)  # another attempt has its own bucket
    b.admit(("a", 1), 10, now=0.1)  # refilled at the rate


def test_bytes_and_requests_in_flight_are_budgeted() -> None:
    b = budgets()
    b.admit(("a", 1), 1500, now=0.0)
    with pytest.raises(GatewayRateLimitedError) as caught:
        b.admit(("a", 1), 1500, now=0.0)  # 500 bytes left: a second wait
    assert caught.value.retry_after_s == pytest.approx(1.0)
    b.admit(("a", 1), 100, now=0.0)
    with pytest.raises(GatewayRateLimitedError, match="in flight"):
        b.admit(("a", 1), 1, now=0.0)
    b.release(("a", 1))
    b.admit(("a", 1), 1, now=0.0)


@pytest.fixture(scope="module")
def strict_gateway(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway of its own with a small rate, so a short flood crosses it."""
    g = Gateway(worker_env(
        PLAYRUN_GATEWAY_URL=f"http://127.0.0.1:{free_port()}",
        PLAYRUN_GATEWAY_SOCKET=str(tmp_path_factory.mktemp("gw") / "gateway.sock"),
        PLAYRUN_GATEWAY_ATTEMPT_REQUESTS_PER_S="2", PLAYRUN_GATEWAY_ATTEMPT_REQUEST_BURST="10"))
    yield g
    g.stop()


def test_a_flood_from_one_attempt_is_rate_limited_and_others_are_not(
        strict_gateway: Gateway) -> None:
    gateway = strict_gateway
    hostile, quiet = launched(), launched()
    token = hostile.token()
    with ThreadPoolExecutor(16) as pool:  # cheap refusals: they are budgeted all the same
        codes = list(pool.map(lambda _: call(gateway, token, None, raw=b"{not json"),
                              range(40)))
    limited = [r for r in codes if r.status_code == 429]
    assert limited, "the flood was never limited"
    assert limited[0].json()["code"] == "GATEWAY_RATE_LIMITED"
    assert int(limited[0].headers["retry-after"]) >= 1
    assert limited[0].json()["retry_after_s"] > 0
    assert call(gateway, quiet.token(), {"action": "heartbeat"}).status_code == 200


def test_a_body_too_large_is_413_even_past_the_byte_budget(strict_gateway: Gateway) -> None:
    """A body the gateway would never read is refused for its size, before any budget."""
    run = launched()
    token = run.token()
    big = b" " * (3 * 1024 * 1024)  # under the limit, so each one spends the byte bucket
    with ThreadPoolExecutor(4) as pool:
        spent = list(pool.map(lambda _: call(strict_gateway, token, None, raw=big), range(8)))
    assert any(r.status_code == 429 for r in spent), [r.status_code for r in spent]
    refused(call(strict_gateway, token, None, raw=b" " * (10 * 1024 * 1024)), 413,
            "GATEWAY_BODY_TOO_LARGE")


def test_the_runner_client_waits_out_the_rate_and_keeps_its_place(
        strict_gateway: Gateway) -> None:
    run = launched()
    client = runner_client.Gateway(strict_gateway.url, None)
    answers = [client.call(run.token(), {"action": "heartbeat"}) for _ in range(14)]
    assert all(a["cancel"] is False for a in answers)  # none refused, none lost


def test_a_large_body_refused_unread_closes_its_connection(strict_gateway: Gateway) -> None:
    """A refused body is not drained: the connection closes, and small refusals keep theirs."""
    run = launched()
    headers = {"Authorization": f"Bearer {run.token()}", "Content-Type": "application/json"}
    url = strict_gateway.url + "/v1/runtime"
    with httpx.Client(timeout=30) as client:
        big = client.post(url, content=b" " * (10 * 1024 * 1024), headers=headers)
        assert big.status_code == 413 and big.headers.get("connection") == "close"
        small = client.post(url, content=b"{not json", headers=headers)
        assert small.status_code == 400 and small.headers.get("connection") != "close"
