"""Start permits from an in-memory limiter for the unit tier (the fleet-wide bucket lives
in Redis); the `fake_stack` fixture (tests/conftest.py) puts it in place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks.acquisition.startrate import Penalty, Permit


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
