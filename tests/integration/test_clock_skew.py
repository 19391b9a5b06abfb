"""A worker whose clock is minutes off still launches runners the gateway accepts: the
runner's tokens are issued by the database clock, not the worker's (found by the chaos
suite: a worker 5 minutes ahead minted tokens "not yet valid", and every run it launched
failed with RUNTIME_RUNNER_LOST)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import pytest

import tasks
from tasks.execution.launch import Launch, launch
from tasks.sandbox import SandboxProvider, SandboxRef
from tasks.settings import get_settings
from tests.support.gateway import call
from tests.support.runs import must_claim, new_run
from tests.support.stack import Gateway


class Capture:
    """Stands in for a provider: keeps the environment the runner would have been given."""

    name = "local"

    def __init__(self) -> None:
        self.env: dict[str, str] = {}

    def exec_detached(self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str],
                      timeout_s: float) -> None:
        self.env = dict(env)


@pytest.mark.parametrize("skew_s", [300.0, -3600.0])
def test_a_skewed_worker_launches_a_runner_the_gateway_accepts(
        gateway: Gateway, monkeypatch: pytest.MonkeyPatch, skew_s: float) -> None:
    run_id = new_run()
    fence = must_claim(run_id)
    provider = Capture()
    real = time.time
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: real() + skew_s)  # the worker's clock, minutes off
        sandbox = SandboxRef("fake", f"sb-skew-{run_id}", {}, real())
        launched = launch(fence, cast(SandboxProvider, provider), sandbox, None,
                          tasks.get_run(run_id).org_id, get_settings())
    assert launched.step is Launch.LAUNCHED
    answer: Any = call(gateway, provider.env["PLAYRUN_TOKEN"], {"action": "heartbeat"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["cancel"] is False
