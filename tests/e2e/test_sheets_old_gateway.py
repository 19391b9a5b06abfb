"""A runner meets an older gateway that does not know `sheet_start_with_intent`: the run
fails RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE and nothing falls back to the legacy start.

The older release is a second real gateway process without the action in its table
(tests/support/old_gateway.py), on its own port and socket; this module's worker (and so its
sandboxes) is pointed at it."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import tasks
from tasks.execution.runner_sheets import RuntimeSheetWriteIntentUnavailableError
from tasks.execution.runner_sheets import Sheet as SheetClient
from tasks.host.processes import free_port
from tests.support.runs import close_open_runs
from tests.support.sheets import (
    ORG_PREFIX,
    PLAY_NAME,
    SHEET_PLAY,
    LossyProxy,
    PlayCtx,
    db_rows,
    intents,
    new_org,
)
from tests.support.sheets import launch as launch_by_hand
from tests.support.stack import Gateway, Worker, worker_env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _close_hand_driven_runs(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)


@pytest.fixture(scope="module")
def older_env(pg_url: str) -> Iterator[dict[str, str]]:
    directory = Path(tempfile.mkdtemp(prefix="playrun-test-old-gw-"))
    yield worker_env(
        PLAYRUN_GATEWAY_URL=f"http://127.0.0.1:{free_port()}",
        PLAYRUN_GATEWAY_SOCKET=str(directory / "sock" / "gateway.sock"),
        PLAYRUN_REAP_INTERVAL_S="1")


class OlderGateway(Gateway):
    module = "tests.support.old_gateway"  # the real gateway without sheet_start_with_intent


@pytest.fixture(scope="module")
def older_gateway(older_env: dict[str, str]) -> Iterator[Gateway]:
    g = OlderGateway(older_env)
    yield g
    g.stop()


@pytest.fixture(scope="module")
def older_worker(older_env: dict[str, str], older_gateway: Gateway) -> Iterator[Worker]:
    w = Worker(older_env, beat=True)
    w.wait_ready()
    yield w
    w.stop()


def test_a_run_on_an_older_gateway_fails_write_intent_unavailable(
        older_worker: Worker, older_gateway: Gateway) -> None:
    org = new_org()
    handle = tasks.submit_run(SHEET_PLAY, input={"rows": [{"domain": "a.com"}]}, org_id=org)
    result = handle.wait(timeout=90)
    assert (result.status, result.code) == ("failed", "RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE")
    assert result.error is not None and "does not offer sheet write intents" in result.error
    # Nothing was admitted, by either start: no intent, legacy or stable, and no rows.
    assert intents(handle.id) == [] and db_rows(org) == {}
    assert tasks.sheet_rows(org, PLAY_NAME, "companies") == []


def test_the_client_never_falls_back_to_the_legacy_start(older_gateway: Gateway) -> None:
    run = launch_by_hand()
    proxy = LossyProxy(older_gateway.url, "none", drop=0)  # only to see every request
    try:
        ctx = PlayCtx(run, proxy.url)
        with pytest.raises(RuntimeSheetWriteIntentUnavailableError):
            SheetClient(ctx, "companies").map([{"domain": "a.com"}], str, key="domain")
    finally:
        proxy.close()
    assert [a for a, _ in proxy.seen] == ["sheet_start_with_intent"]
    assert ctx.halted is not None and ctx.halted[0] == "RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE"
    assert intents(run.run_id) == []
