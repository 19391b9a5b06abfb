"""A play that ends its own runner hard in a cloud sandbox settles within seconds, as in a
local one: the boot script reports the exit to the gateway and a worker inspects at once.

Each cloud provider's double with its real SDK, a real worker, and a gateway of the
module's own whose heartbeat timeout (60 s) is far above the bound, so the heartbeat
backstop cannot be what settles these runs. The doubles run a sandbox's processes on this
host, so the play writes the time of its exit to a file here: the bound holds from the exit
itself to the terminal (the database runs on this host too, so the clocks agree).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import tasks
from tasks.constants import OUTPUT_INVALID, RUNTIME_RUNNER_LOST
from tasks.errors import PlayrunError
from tasks.security import tokens
from tasks.settings import get_settings
from tests.doubles.base import Double
from tests.support.cloud import CLOUD, cloud, stack_env
from tests.support.hard_exit import (
    BOUND_S,
    HARD_EXIT,
    HEARTBEAT_TIMEOUT_S,
    OwnGateway,
    exit_to_terminal_s,
    org,
    own_gateway,
)
from tests.support.helpers import eventually, kinds
from tests.support.paths import PLAYS
from tests.support.runs import TERMINAL_EVENTS
from tests.support.stack import Worker

pytestmark = pytest.mark.slow
# Without the report, the heartbeat timeout notices the exit: short, so the test is too.
SHORT_HEARTBEAT_TIMEOUT_S = 4.0
JWT = re.compile(rb"eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Stack:
    double: Double
    worker: Worker
    gateway: OwnGateway


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, pg_url: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A double, a worker with PLAYRUN_EXIT_REPORT on or off, and its own gateway; one
    stack at a time (their workers would share the start queue)."""
    name, report = request.param
    cloud(name)
    root = tmp_path_factory.mktemp(f"{name}-report-{report}")
    heartbeat_s = HEARTBEAT_TIMEOUT_S if report == "true" else SHORT_HEARTBEAT_TIMEOUT_S
    with own_gateway(heartbeat_s) as gateway, CLOUD[name](root) as double:
        at = gateway.env
        env = stack_env(double, root / "sandboxes", PLAYRUN_EXIT_REPORT=report,
                        PLAYRUN_GATEWAY_URL=at["PLAYRUN_GATEWAY_URL"],
                        PLAYRUN_GATEWAY_SOCKET=at["PLAYRUN_GATEWAY_SOCKET"],
                        PLAYRUN_HEARTBEAT_TIMEOUT_S=at["PLAYRUN_HEARTBEAT_TIMEOUT_S"],
                        PLAYRUN_START_RATE_INITIAL_PER_MIN="6000",
                        PLAYRUN_START_RATE_MAX_PER_MIN="12000")
        worker = Worker(env)
        try:
            worker.wait_ready()
            yield Stack(double, worker, gateway)
        finally:
            worker.stop()


def stacks(report: str) -> list[object]:
    return [pytest.param((name, report), id=name) for name in sorted(CLOUD)]


def failed_with(stack: Stack, run: tasks.RunHandle, code: str) -> str:
    """The run's error, once it failed with `code` well inside the heartbeat timeout."""
    result = run.wait(timeout=HEARTBEAT_TIMEOUT_S / 2)
    assert (result.status, result.code) == ("failed", code), \
        (result, stack.worker.output()[-3000:])
    view = tasks.get_run(run.id)
    assert (view.status, view.code) == ("failed", code)
    return result.error or ""


@pytest.mark.parametrize("stack", stacks("true"), indirect=True)
@pytest.mark.parametrize(("how", "code", "says"), [
    ("exit", RUNTIME_RUNNER_LOST, "exited with code 0 without a result"),
    ("killpg", RUNTIME_RUNNER_LOST, "killed by signal 9"),
    ("nested", OUTPUT_INVALID, "nested deeper than"),
    ("huge_number", OUTPUT_INVALID, "1e400 is out of range"),
    # What a link reads as is the provider's file API's business; never its target.
    ("symlink", OUTPUT_INVALID, ""),
])
def test_a_hard_exit_settles_within_seconds_of_the_exit(
        stack: Stack, how: str, code: str, says: str, tmp_path: Path) -> None:
    reported = stack.gateway.exits_reported()
    marker = tmp_path / "exited-at"
    run = tasks.submit_run(HARD_EXIT, input={"how": how, "marker": str(marker)},
                           org_id=org())
    error = failed_with(stack, run, code)
    assert says in error, error
    assert "heartbeats stopped" not in error
    assert "root:" not in error  # the symlink's target is never read
    took = exit_to_terminal_s(run.id, marker)
    assert took <= BOUND_S, f"{took:.2f} s from the exit to the terminal"
    assert stack.gateway.exits_reported() == reported + 1
    if code == RUNTIME_RUNNER_LOST:
        assert "runner.lost" in kinds(run.id)
    eventually(lambda: stack.double.live_count() == 0, what="the sandbox to be deleted")


@pytest.mark.parametrize("stack", stacks("true"), indirect=True)
def test_a_play_error_is_settled_by_its_runner_and_the_report_changes_nothing(
        stack: Stack) -> None:
    run = tasks.submit_run(PLAYS / "raises.py", input={}, org_id=org())
    assert "the customer code broke" in failed_with(stack, run, "PLAY_ERROR")
    eventually(lambda: stack.double.live_count() == 0, what="the sandbox to be deleted")
    seen = kinds(run.id)
    assert "runner.lost" not in seen
    assert sum(kind in TERMINAL_EVENTS for kind in seen) == 1
    view = tasks.get_run(run.id)
    assert (view.status, view.code) == ("failed", "PLAY_ERROR")


def capabilities_found(dump: bytes, run_id: str) -> set[str]:
    """Every capability of this run's tokens that appears in `dump`."""
    secret = get_settings().secret_key  # the workers' too (worker_env)
    found: set[str] = set()
    for candidate in set(JWT.findall(dump)):
        try:
            grant = tokens.verify(candidate.decode(), secret)
        except PlayrunError:
            continue
        if grant.run_id == run_id:
            found |= grant.capabilities
    return found


@pytest.mark.parametrize("stack", stacks("true"), indirect=True)
def test_the_play_never_finds_the_exit_token(stack: Stack, tmp_path: Path) -> None:
    dump = tmp_path / "seen.txt"
    run = tasks.submit_run(PLAYS / "seek_tokens.py", input={"dump": str(dump)}, org_id=org())
    failed_with(stack, run, RUNTIME_RUNNER_LOST)  # in seconds: a token did report the exit
    found = capabilities_found(dump.read_bytes(), run.id)
    assert tokens.RUN_HEARTBEAT in found  # the search does find the runner's own tokens
    assert tokens.RUN_EXIT not in found
    eventually(lambda: stack.double.live_count() == 0, what="the sandbox to be deleted")


@pytest.mark.parametrize("stack", stacks("false"), indirect=True)
def test_with_the_exit_report_off_nothing_is_sent(stack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "exited-at"
    run = tasks.submit_run(HARD_EXIT, input={"how": "exit", "marker": str(marker)},
                           org_id=org())
    error = failed_with(stack, run, RUNTIME_RUNNER_LOST)
    assert "its heartbeats stopped and it exited with code 0" in error, error
    assert stack.gateway.exits_reported() == 0
    eventually(lambda: stack.double.live_count() == 0, what="the sandbox to be deleted")
