"""A play that ends its own runner hard settles within seconds, not at the heartbeat timeout:
the sandbox's supervisor reports the exit and the sandbox's host inspects it at once.

A real gateway and worker on the local provider, in process isolation and (where bubblewrap
works) strict, with a heartbeat timeout of 60 s, so the heartbeat backstop cannot be what
settles these runs. The time to settle is measured from the sandbox going live (recorded
before the play even starts): a bound on the time from the exit to the terminal.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import tasks
from tasks.sandbox.local import probe_strict
from tasks.settings import get_settings
from tests.support.env import SANDBOX_ROOT
from tests.support.hard_exit import (
    BOUND_S,
    HARD_EXIT,
    HEARTBEAT_TIMEOUT_S,
    org,
    own_gateway,
    settle_s,
)
from tests.support.helpers import eventually, kinds
from tests.support.paths import PLAYS
from tests.support.runs import TERMINAL_EVENTS
from tests.support.stack import Worker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack_env(pg_url: str) -> Iterator[dict[str, str]]:
    with own_gateway() as gateway:
        yield gateway.env


@pytest.fixture(scope="module", params=["process", "strict"])
def isolation(request: pytest.FixtureRequest, stack_env: dict[str, str]) -> Iterator[str]:
    """One worker at a time (they would share the start queue), in each isolation mode."""
    mode: str = request.param
    if mode == "strict" and (problem := probe_strict(get_settings(), SANDBOX_ROOT)):
        pytest.skip(f"strict isolation unavailable here: {problem}")
    worker = Worker({**stack_env, "PLAYRUN_SANDBOX_ISOLATION": mode})
    worker.wait_ready()
    assert f"sandbox isolation: {mode}" in worker.output()
    yield mode
    worker.stop()


@pytest.mark.parametrize(("how", "code", "says"), [
    ("exit", "RUNTIME_RUNNER_LOST", "exited with code 0 without a result"),
    ("killpg", "RUNTIME_RUNNER_LOST", "killed by signal 9"),
    ("kill", "RUNTIME_RUNNER_LOST", "killed by signal 9"),
    ("nested", "OUTPUT_INVALID", "nested deeper than"),
    ("huge_number", "OUTPUT_INVALID", "1e400 is out of range"),
    ("symlink", "OUTPUT_INVALID", "could not be read"),
])
def test_a_hard_exit_settles_within_seconds(isolation: str, how: str, code: str,
                                            says: str) -> None:
    handle = tasks.submit_run(HARD_EXIT, input={"how": how}, org_id=org())
    result = handle.wait(timeout=HEARTBEAT_TIMEOUT_S / 2)
    assert (result.status, result.code) == ("failed", code), result
    view = tasks.get_run(handle.id)
    assert (view.status, view.code) == ("failed", code)
    assert says in (result.error or ""), result.error
    assert "heartbeats stopped" not in (result.error or "")
    assert "root:" not in (result.error or "")  # the symlink's target is never read
    assert settle_s(handle.id) <= BOUND_S
    if code == "RUNTIME_RUNNER_LOST":
        assert "runner.lost" in kinds(handle.id)
    eventually(lambda: "capacity.released" in kinds(handle.id), what="the release")


def test_a_play_that_raises_is_play_error_and_its_exit_report_changes_nothing(
        isolation: str) -> None:
    handle = tasks.submit_run(PLAYS / "raises.py", input={}, org_id=org())
    result = handle.wait(timeout=HEARTBEAT_TIMEOUT_S / 2)
    assert (result.status, result.code) == ("failed", "PLAY_ERROR"), result
    assert "the customer code broke" in (result.error or "")
    assert settle_s(handle.id) <= BOUND_S
    eventually(lambda: "sandbox.deleted" in kinds(handle.id), what="the sandbox deleted")
    seen = kinds(handle.id)
    assert "runner.lost" not in seen
    assert sum(kind in TERMINAL_EVENTS for kind in seen) == 1
    view = tasks.get_run(handle.id)
    assert (view.status, view.code) == ("failed", "PLAY_ERROR")
