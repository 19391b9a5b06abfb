"""Hypothesis drives interleavings of claims, lease expiry, reaper adoption, settlements
and renewals against real PostgreSQL; the fence invariants hold after every step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models import Attempt, db_now
from tasks.acquisition.claim import Claimed
from tasks.constants import TERMINAL_STATUSES, AttemptState, RunStatus
from tasks.errors import FenceLostError
from tasks.maintenance.reaper import _adopt
from tasks.settings import get_settings
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle
from tasks.store.db import session_scope
from tasks.store.fence import Fence, hold, renew
from tests.support.runs import (
    ORG_PREFIX,
    TERMINAL_EVENTS,
    claim_now,
    close_open_runs,
    is_current,
    new_run,
    outcome_of,
    snapshot,
    supersede,
)


@pytest.fixture(scope="module", autouse=True)
def _no_open_runs_left(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)


# --- interleavings (hypothesis) -------------------------------------------------------------

OUTCOMES = [
    Outcome(RunStatus.SUCCEEDED, output={"n": 1}),
    Outcome(RunStatus.FAILED, "PLAY_ERROR", "boom"),
    Outcome("cancelled", "CANCELLED", "the run was cancelled"),
]
OPS = st.one_of(
    st.tuples(st.just("claim"), st.sampled_from(["A", "B"])),
    st.tuples(st.just("expire")),
    st.tuples(st.just("adopt")),
    st.tuples(st.just("settle"), st.sampled_from(["A", "B", "R"]), st.integers(0, 2)),
    st.tuples(st.just("renew"), st.sampled_from(["A", "B", "R"])),
    st.tuples(st.just("supersede")),
)


def _expire(run_id: str) -> None:
    """Time passes for the active attempt: its lease is now behind the database clock."""
    with session_scope() as session:
        session.execute(sa.update(Attempt).where(
            Attempt.run_id == run_id, Attempt.state == AttemptState.ACTIVE,
        ).values(lease_expires_at=db_now(-1)))


def _active_count(snap: dict[str, Any]) -> int:
    return sum(1 for a in snap["attempts"] if a[2] == AttemptState.ACTIVE)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=1, max_size=14))
def test_interleavings_keep_the_fence_invariants(pg_url: str, ops: list[tuple[Any, ...]]) -> None:
    run_id = new_run()
    fences: dict[str, Fence] = {}
    terminal: Outcome | None = None
    for op in ops:
        before = snapshot(run_id)
        name = op[0]
        if name == "claim":
            result = claim_now(run_id, op[1])
            if isinstance(result, Claimed):
                assert _active_count(before) == 0 and before["run"][0] not in TERMINAL_STATUSES
                assert result.fence.generation == before["run"][4] + 1
                fences[op[1]] = result.fence
            else:
                assert snapshot(run_id) == before, f"a skipped claim ({result}) wrote"
        elif name == "expire":
            _expire(run_id)
        elif name == "adopt":
            adopted = _adopt(run_id, get_settings())
            if adopted is not None:
                fences["R"] = adopted.fence
            else:
                assert snapshot(run_id) == before
        elif name == "supersede":
            supersede(run_id)
        elif op[1] in fences:
            fence = fences[op[1]]
            current = is_current(fence)
            try:
                if name == "settle":
                    settled = settle(fence, OUTCOMES[op[2]], reason="test")
                else:
                    with session_scope() as session:
                        hold(session, fence)
                        renew(session, fence, 30)
            except FenceLostError:
                assert not current, f"{op} by the current holder was refused"
                assert snapshot(run_id) == before, f"a refused {op} wrote"
            else:
                if name == "renew":
                    assert current, f"a renew by a stale fence committed: {op}"
                elif settled.won:
                    assert current, f"a settle by a stale fence won: {op}"
                    assert terminal is None
                    terminal = OUTCOMES[op[2]]
                else:
                    assert terminal is not None and settled.outcome == terminal
                    assert snapshot(run_id) == before
        # Invariants after every step.
        after = snapshot(run_id)
        assert _active_count(after) <= 1, after["attempts"]
        kinds_now = [e[1] for e in after["events"]]
        if terminal is not None:
            assert outcome_of(run_id) == terminal
            assert sum(k in TERMINAL_EVENTS for k in kinds_now) == 1
        else:
            assert after["run"][0] not in TERMINAL_STATUSES
            assert not any(k in TERMINAL_EVENTS for k in kinds_now)
        assert kinds_now.count("attempt.started") == after["run"][4]
