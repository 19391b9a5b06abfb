"""The unit tier runs with no PostgreSQL and no Redis: starts are published at admission
(FIFO order) and the gateway keeps its budgets in memory. Fair order and the fleet-wide
gateway budgets keep their state in Redis; tests/integration and tests/e2e cover them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _fifo_without_redis(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from tasks.settings import reset_settings

    monkeypatch.setenv("PLAYRUN_START_ORDER", "fifo")
    monkeypatch.setenv("PLAYRUN_GATEWAY_SHARED_BUDGETS", "false")
    reset_settings()
    yield
    reset_settings()
