"""The chaos suite's own harness, on its cheapest kind: a gateway kill -9 and restart under
5 runs, with every invariant checked (bench/chaos.py runs all kinds)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bench.chaos import holds
from bench.chaoslib.faults import GatewayRestart
from bench.chaoslib.suite import Plan, run_kind
from tasks.settings import reset_settings

pytestmark = pytest.mark.slow


@pytest.fixture
def own_environment() -> Iterator[None]:
    """The suite points PLAYRUN_* at its own database and Redis: give the session's back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    reset_settings()


def test_a_gateway_restart_loses_doubles_and_leaks_nothing(own_environment: None) -> None:
    result = run_kind(GatewayRestart(), Plan(n=5, spread_s=4, fault_s=2))
    assert "skipped" not in result, result
    assert result["submitted"] == 5 and result["lost"] == 0, result
    assert result["doubled"] == 0 and result["stuck"] == 0, result
    assert result["executions"] == 5  # the side-effect count saw every play: it can see two
    assert (result["slots"], result["resources"], result["sandboxes"]) == (0, 0, 0), result
    assert result["recovery_s"] is not None
    assert holds(result), result
