"""Unit-tier helpers: a SQLite database with the `fake` provider in a private sandbox root,
and start permits from an in-memory limiter (the fleet-wide bucket lives in Redis)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tasks.acquisition.startrate import Penalty, Permit
from tasks.sandbox.fake import FakeScript


@dataclass
class FakeLimiter:
    """Grants every permit (or refuses with `wait_ms`); records what it was asked."""

    wait_ms: int = 0
    asked: list[str] = field(default_factory=list)
    penalties: list[int] = field(default_factory=list)

    def acquire(self, bucket: str, rules: Any, observed_successes: int = 0) -> Permit:
        self.asked.append(bucket)
        granted = self.wait_ms == 0
        return Permit(granted=granted, wait_ms=self.wait_ms, scheduled_at_ms=0,
                      server_now_ms=0, rate=60.0, epoch=1, degraded=False)

    def penalize_detail(self, bucket: str, rules: Any, epoch: int, cooldown_ms: int) -> Penalty:
        self.penalties.append(epoch)
        return Penalty(applied=True, rate=30.0, epoch=epoch + 1, cooldown_until_ms=0,
                       server_now_ms=0)


@pytest.fixture
def fake_stack(sqlite_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
               ) -> Iterator[FakeScript]:
    """SQLite, the `fake` provider (runners handed to a host that is not running: no
    process starts) and the in-memory limiter; yields the fault script."""
    from tasks.acquisition import permits, starthistory
    from tasks.settings import reset_settings

    root = tmp_path / "sandboxes"
    monkeypatch.setenv("PLAYRUN_SANDBOX_PROVIDER", "fake")
    monkeypatch.setenv("PLAYRUN_SANDBOX_ROOT", str(root))
    reset_settings()
    limiter = FakeLimiter()
    monkeypatch.setattr(permits, "limiter", lambda: limiter)
    monkeypatch.setattr(starthistory, "record_permit", lambda *a, **k: None)
    monkeypatch.setattr(starthistory, "record_penalty", lambda *a, **k: None)
    script = FakeScript(root)
    script.set(hosted_runners=True)
    yield script
    reset_settings()
