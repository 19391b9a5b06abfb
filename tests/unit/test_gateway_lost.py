"""The gateway's memory of launches that lost their fence: keyed by the launch, bounded,
rid of what has expired first, and its refusals paced per launch."""

from __future__ import annotations

import pytest

from tasks.gateway.lost import PACE_S, WAIT_MAX_S, LostLaunches, refusal
from tasks.security.tokens import EXIT_CAPABILITIES, RUNNER_CAPABILITIES, Grant


def grant(run: str, *, generation: int = 1, launch: str = "L", expires_at: float = 100.0,
          capabilities: tuple[str, ...] = RUNNER_CAPABILITIES) -> Grant:
    return Grant(org_id="o", run_id=run, generation=generation, launch_id=launch,
                 capabilities=frozenset(capabilities), expires_at=expires_at)


def refused(lost: LostLaunches, g: Grant) -> bool:
    return lost.hold_s(g) is not None


def test_only_the_lost_launch_is_refused() -> None:
    lost = LostLaunches()
    lost.lost(grant("r"), now=0)
    assert refused(lost, grant("r", expires_at=500))  # a fresh token of the same launch
    assert not refused(lost, grant("r", launch="M"))  # another launch of the attempt
    assert not refused(lost, grant("r", generation=2))  # the run's next attempt
    assert not refused(lost, grant("s"))
    # The supervisor's exit report of that launch is still answered (as late news).
    assert not refused(lost, grant("r", capabilities=EXIT_CAPABILITIES))


def test_past_the_limit_the_expired_go_first_then_the_oldest() -> None:
    lost = LostLaunches(limit=10)
    for i in range(5):
        lost.lost(grant(f"old{i}", expires_at=10.0), now=0)
    for i in range(5):
        lost.lost(grant(f"new{i}", expires_at=1000.0), now=0)
    lost.lost(grant("late", expires_at=1000.0), now=50)  # the five expired go
    assert len(lost) == 6
    assert not any(refused(lost, grant(f"old{i}")) for i in range(5))
    assert refused(lost, grant("late")) and refused(lost, grant("new0"))
    for i in range(4):
        lost.lost(grant(f"more{i}", expires_at=1000.0), now=50)
    lost.lost(grant("last", expires_at=1000.0), now=50)  # none expired: the oldest go
    assert len(lost) <= 10
    assert not refused(lost, grant("new0")) and refused(lost, grant("last"))


@pytest.mark.parametrize("limit", [1, 2, 7])
def test_the_map_never_passes_its_limit(limit: int) -> None:
    lost = LostLaunches(limit=limit)
    for i in range(50):
        lost.lost(grant(f"r{i}", expires_at=1000.0), now=0)
        assert len(lost) <= limit
        assert refused(lost, grant(f"r{i}"))


def test_a_lost_launch_is_answered_at_its_pace_whatever_its_connections() -> None:
    lost = LostLaunches()
    g = grant("r", expires_at=10_000.0)
    lost.lost(g, now=0.0)  # the database's own FENCE_LOST: answered at once
    # Eight requests at the same moment (eight connections): one slot each, PACE_S apart,
    # none held past WAIT_MAX_S.
    holds = [lost.hold_s(g, now=0.0) for _ in range(8)]
    expected = [min(PACE_S * (i + 1), WAIT_MAX_S) for i in range(8)]
    assert holds == pytest.approx(expected)
    # Quiet for a while: the next request waits for no one.
    assert lost.hold_s(g, now=100.0) == 0.0
    assert lost.hold_s(g, now=100.0) == pytest.approx(PACE_S)
    # Another launch's pace is its own.
    other = grant("s", expires_at=10_000.0)
    lost.lost(other, now=100.0)
    assert lost.hold_s(other, now=100.0 + PACE_S) == 0.0


def test_the_refusal_names_the_launch_and_says_fence_lost() -> None:
    exc = refusal(grant("r"))
    assert exc.code == "FENCE_LOST" and "launch L of run r" in exc.message
