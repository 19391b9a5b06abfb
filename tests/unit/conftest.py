"""The unit tier runs with no PostgreSQL and no Redis: starts are published at admission
(FIFO order). Fair order keeps its relay state in Redis; tests/integration and tests/e2e
cover it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _fifo_without_redis(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from tasks.settings import reset_settings

    monkeypatch.setenv("PLAYRUN_START_ORDER", "fifo")
    reset_settings()
    yield
    reset_settings()
