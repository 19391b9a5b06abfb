"""A terminal pushed by the runner (settle_launch) on PostgreSQL: the one-statement common
case, and the cases the general transaction decides (a terminal won already, a cancel, a
launch no longer current, an output the database refuses)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from models import Attempt, Run, db_now
from tasks.errors import FenceLostError
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle_launch
from tasks.store import ledger
from tasks.store.db import session_scope
from tasks.store.fence import LaunchFence
from tests.support.runs import ORG_PREFIX, close_open_runs, launched


@pytest.fixture(scope="module", autouse=True)
def _no_open_runs_left(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)  # no later module's reaper adopts what these left open


def ledger_of(run_id: str) -> list[tuple[str, dict[str, object]]]:
    with session_scope() as s:
        return [(e.kind, e.data) for e in ledger.read(s, run_id)]


def run_and_attempt(fence: LaunchFence) -> tuple[tuple[object, ...], tuple[object, ...]]:
    with session_scope() as s:
        run = s.execute(sa.select(Run.status, Run.code, Run.output, Run.finished_at.is_not(None))
                        .where(Run.id == fence.run_id)).one()
        attempt = s.execute(sa.select(Attempt.state, Attempt.end_reason).where(
            Attempt.run_id == fence.run_id, Attempt.generation == fence.generation)).one()
    return tuple(run), tuple(attempt)


def test_the_first_push_wins_and_names_who_holds_the_rest(pg_url: str) -> None:
    fence, token = launched()
    settled = settle_launch(fence, Outcome("succeeded", output={"n": 1, "s": "é"}))
    assert settled.won and settled.holder_token == token
    assert run_and_attempt(fence) == (("succeeded", None, {"n": 1, "s": "é"}, True),
                                      ("ended", "pushed"))
    assert ledger_of(fence.run_id)[-1] == ("run.succeeded", {"code": None, "error": None})
    again = settle_launch(fence, Outcome("failed", "PLAY_ERROR", "late"))
    assert not again.won and again.outcome.status == "succeeded"
    assert [k for k, _ in ledger_of(fence.run_id)].count("run.succeeded") == 1
    assert "run.failed" not in [k for k, _ in ledger_of(fence.run_id)]


def test_dropped_progress_is_counted_just_before_the_terminal(pg_url: str) -> None:
    fence, _ = launched()
    with session_scope() as s:
        s.execute(sa.update(Attempt).where(Attempt.run_id == fence.run_id)
                  .values(progress_dropped=7, progress_count=3))
    assert settle_launch(fence, Outcome("failed", "PLAY_ERROR", "it raised")).won
    assert ledger_of(fence.run_id)[-2:] == [
        ("run.progress_dropped", {"dropped": 7, "kept": 3}),
        ("run.failed", {"code": "PLAY_ERROR", "error": "it raised"})]


def test_a_cancel_recorded_first_writes_nothing_and_reports_cancelled(pg_url: str) -> None:
    fence, _ = launched()
    with session_scope() as s:
        s.execute(sa.update(Run).where(Run.id == fence.run_id)
                  .values(cancel_requested_at=db_now()))
    settled = settle_launch(fence, Outcome("succeeded", output={}))
    assert not settled.won and settled.outcome.status == "cancelled"
    assert run_and_attempt(fence) == (("running", None, None, False), ("active", None))


def test_a_launch_no_longer_current_is_a_fence_loss(pg_url: str) -> None:
    fence, _ = launched()
    stale = LaunchFence(fence.run_id, fence.generation, uuid.uuid4().hex)
    with pytest.raises(FenceLostError):
        settle_launch(stale, Outcome("succeeded", output={}))
    assert run_and_attempt(fence)[0][0] == "running"


def test_an_output_the_database_refuses_settles_output_invalid(pg_url: str) -> None:
    fence, _ = launched()
    settled = settle_launch(fence, Outcome("succeeded", output={"s": "a\u0000b"}))
    assert settled.won and settled.outcome.code == "OUTPUT_INVALID"
    assert run_and_attempt(fence)[0][:2] == ("failed", "OUTPUT_INVALID")
