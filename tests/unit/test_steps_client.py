"""The play's side of `ctx.step` (playrun_steps.py) against the gateway served over HTTP on
SQLite: a receipt is computed once per org and play, reused by later runs, held while its
claimer runs, freed when its fn fails, and a run that lost its fence stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tasks.execution.runner_steps import StepError, Steps
from tests.support.runs import supersede
from tests.support.sheets import PlayCtx, Stopped, launch, new_org
from tests.support.units import ServedGateway, served_gateway


@pytest.fixture(scope="module")
def _served() -> Iterator[ServedGateway]:
    with served_gateway() as served:
        yield served


@pytest.fixture
def gateway(sqlite_db: str, _served: ServedGateway) -> ServedGateway:
    """The module's gateway, on this test's database (it reads the settings per request)."""
    return _served


def steps_of(ctx: PlayCtx, within_s: float = 30.0) -> Steps:
    return Steps(ctx._uplink, time.monotonic() + within_s)


def test_a_step_runs_once_and_later_runs_of_the_org_reuse_its_output(
        gateway: ServedGateway) -> None:
    org = new_org()
    first = PlayCtx(launch(org), gateway.url)
    calls: list[int] = []

    def rate() -> dict[str, Any]:
        calls.append(1)
        return {"EUR": 1.09}

    assert steps_of(first).step("fx:EUR", rate) == {"EUR": 1.09}
    assert steps_of(PlayCtx(launch(org), gateway.url)).step("fx:EUR", rate) == {"EUR": 1.09}
    assert calls == [1]
    # Another org has receipts of its own.
    assert steps_of(PlayCtx(launch(), gateway.url)).step("fx:EUR", rate) == {"EUR": 1.09}
    assert calls == [1, 1]


def test_a_failed_step_is_free_for_the_next_run_to_compute(gateway: ServedGateway) -> None:
    org = new_org()

    def boom() -> Any:
        raise LookupError("upstream said no")

    with pytest.raises(LookupError):
        steps_of(PlayCtx(launch(org), gateway.url)).step("k", boom)
    assert steps_of(PlayCtx(launch(org), gateway.url)).step("k", lambda: 7) == 7


def test_output_that_cannot_be_kept_is_output_invalid_and_not_kept(
        gateway: ServedGateway) -> None:
    org = new_org()
    with pytest.raises(StepError) as err:
        steps_of(PlayCtx(launch(org), gateway.url)).step("k", lambda: {1, 2})
    assert err.value.code == "OUTPUT_INVALID"
    assert steps_of(PlayCtx(launch(org), gateway.url)).step("k", lambda: [1, 2]) == [1, 2]


def test_a_step_held_by_another_run_is_waited_for_then_reused(gateway: ServedGateway) -> None:
    org = new_org()
    holder, waiter = PlayCtx(launch(org), gateway.url), PlayCtx(launch(org), gateway.url)
    claimed, release = threading.Event(), threading.Event()
    got: list[Any] = []

    def slow() -> str:
        claimed.set()
        release.wait(30)
        return "the holder's"

    first = threading.Thread(target=lambda: got.append(steps_of(holder).step("k", slow)))
    first.start()
    assert claimed.wait(30)
    second = threading.Thread(target=lambda: got.append(
        steps_of(waiter).step("k", lambda: "the waiter's")))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # still waiting: the holder's claim is live
    release.set()
    first.join(30)
    second.join(30)
    assert got == ["the holder's", "the holder's"]


def test_a_step_still_held_at_the_time_limit_is_unavailable(gateway: ServedGateway) -> None:
    org = new_org()
    holder = PlayCtx(launch(org), gateway.url)
    release = threading.Event()
    claimed = threading.Event()

    def hold() -> int:
        claimed.set()
        release.wait(30)
        return 1

    thread = threading.Thread(target=lambda: steps_of(holder).step("k", hold))
    thread.start()
    try:
        assert claimed.wait(30)
        with pytest.raises(StepError) as err:
            steps_of(PlayCtx(launch(org), gateway.url), within_s=0.5).step("k", lambda: 2)
        assert err.value.code == "STEP_UNAVAILABLE"
    finally:
        release.set()
        thread.join(30)


def test_a_run_that_lost_its_fence_is_stopped(gateway: ServedGateway) -> None:
    run = launch()
    supersede(run.run_id)
    with pytest.raises(Stopped, match="FENCE_LOST"):
        steps_of(PlayCtx(run, gateway.url)).step("k", lambda: 1)


def test_an_unreachable_gateway_is_unavailable_at_the_deadline(sqlite_db: str) -> None:
    from tasks.host.processes import free_port

    ctx = PlayCtx(launch(), f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StepError) as err:
        steps_of(ctx, within_s=0.3).step("k", lambda: 1)
    assert err.value.code == "STEP_UNAVAILABLE"
