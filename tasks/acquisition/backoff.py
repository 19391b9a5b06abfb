"""Pure maths of the bounded deferral (docs/contract.md): delay with jitter, and the budget."""

from __future__ import annotations

import random
from collections.abc import Callable


def deferral_delay_ms(count: int, *, base_ms: int, max_ms: int, at_least_ms: int = 0,
                      rand: Callable[[], float] = random.random) -> int:
    """Exponential in the number of earlier deferrals, capped, with "equal jitter".

    Half the delay is fixed so waits still grow; the other half is random so a
    fleet deferred by one hold does not come back in lockstep. A known wait (a
    permit's wait_ms) is a floor, since coming back earlier cannot succeed.
    """
    exp = min(max_ms, base_ms * (2 ** min(count, 30)))
    jittered = exp / 2 + rand() * exp / 2
    return max(at_least_ms, int(jittered))


def pacing_delay_ms(wait_ms: int, *, rand: Callable[[], float] = random.random) -> int:
    """A permit's own wait plus up to a quarter more (at most 1 s): runs deferred by one
    throttle come back spread over the bucket's next slots, not all at its first."""
    return wait_ms + int(rand() * min(wait_ms / 4, 1000.0))


def budget_exhausted(count: int, total_ms: int, next_delay_ms: int, *, max_count: int,
                     max_total_ms: int) -> bool:
    """True when one more deferral would pass the per-run count or time budget."""
    return count >= max_count or total_ms + next_delay_ms > max_total_ms
