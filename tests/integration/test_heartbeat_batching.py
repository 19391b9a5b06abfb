"""Heartbeats are answered in batches: many runners beating at once cost one transaction,
and each still gets its own fenced answer (PostgreSQL, in-process batcher)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

import tasks
from models import Attempt, db_now
from tasks.execution.launch import mark_launching
from tasks.gateway.beats import BeatAnswer, BeatBatcher
from tasks.settings import get_settings
from tasks.store.db import get_engine, session_scope
from tasks.store.fence import LaunchFence
from tests.support.runs import ORG_PREFIX, close_open_runs, must_claim, new_run


@pytest.fixture(scope="module", autouse=True)
def _no_open_runs_left(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)  # no later module's reaper adopts what these left open


def launched(n: int) -> list[LaunchFence]:
    fences = []
    for _ in range(n):
        fence = must_claim(new_run())
        launch_id = mark_launching(fence, get_settings())
        assert launch_id is not None
        fences.append(LaunchFence(fence.run_id, fence.generation, launch_id))
    return fences


@pytest.fixture
def commits(pg_url: str) -> Iterator[list[int]]:
    """Transactions committed by this process's engine while the test runs."""
    seen: list[int] = []
    engine = get_engine()

    def on_commit(_conn: object) -> None:
        seen.append(threading.get_ident())

    sa.event.listen(engine, "commit", on_commit)
    yield seen
    sa.event.remove(engine, "commit", on_commit)


def beat_all(batcher: BeatBatcher, fences: list[LaunchFence]) -> dict[LaunchFence, object]:
    answers: dict[LaunchFence, object] = {}
    start = threading.Barrier(len(fences))

    def one(fence: LaunchFence) -> None:
        start.wait()
        answers[fence] = batcher.beat(fence)

    threads = [threading.Thread(target=one, args=(f,)) for f in fences]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return answers


def test_forty_concurrent_beats_take_one_transaction(commits: list[int]) -> None:
    fences = launched(40)
    with session_scope() as s:  # every lease nearly out: every beat must renew
        s.execute(sa.update(Attempt).where(Attempt.run_id.in_([f.run_id for f in fences]))
                  .values(lease_expires_at=db_now(1)))
    batcher = BeatBatcher(timeout_s=30.0, window_s=0.5)
    batcher.beat(fences[0])  # the first transaction opens the window the others share
    commits.clear()
    answers = beat_all(batcher, fences)
    assert len(commits) <= 2, f"{len(commits)} transactions for 40 beats"
    renewed = [a for a in answers.values()
               if a == BeatAnswer(cancel=False, renewed=True, past_deadline=False)]
    assert len(renewed) == 39  # fences[0] renewed on its first beat
    with session_scope() as s:
        left = s.scalars(sa.select(Attempt.lease_expires_at > db_now(20))
                         .where(Attempt.run_id.in_([f.run_id for f in fences]))).all()
    assert all(left)


def test_each_beat_in_a_batch_gets_its_own_fenced_answer(pg_url: str) -> None:
    live, cancelled, stale = launched(3)
    tasks.cancel_run(cancelled.run_id)
    wrong_launch = LaunchFence(stale.run_id, stale.generation, "0" * 32)
    other_generation = LaunchFence(live.run_id, live.generation + 1, live.launch_id)
    batcher = BeatBatcher(timeout_s=30.0, window_s=0.3)
    answers = beat_all(batcher, [live, cancelled, wrong_launch, other_generation])
    answer = answers[live]
    assert isinstance(answer, BeatAnswer) and not answer.cancel and not answer.past_deadline
    cancel = answers[cancelled]
    # A cancelled run that nobody launched is settled at once: its fence is gone.
    assert cancel is None or (isinstance(cancel, BeatAnswer) and cancel.cancel)
    assert answers[wrong_launch] is None and answers[other_generation] is None


def test_a_database_error_reaches_every_waiter_and_the_batcher_goes_on(pg_url: str) -> None:
    (fence,) = launched(1)
    batcher = BeatBatcher(timeout_s=30.0, window_s=0.0)
    bad = LaunchFence("nul\x00id", fence.generation, fence.launch_id)  # PostgreSQL refuses NUL
    with pytest.raises(sa.exc.DBAPIError):
        batcher.beat(bad)
    answer = batcher.beat(fence)
    assert answer is not None and not answer.cancel


def test_beats_awaited_on_one_event_loop_share_a_transaction(commits: list[int]) -> None:
    """The gateway awaits beats on its loop: forty at once hold no threads and commit once."""
    fences = launched(40)
    batcher = BeatBatcher(timeout_s=30.0, window_s=0.5)
    batcher.beat(fences[0])
    commits.clear()

    async def all_at_once() -> list[BeatAnswer | None]:
        return await asyncio.gather(*(batcher.beat_async(f) for f in fences))

    answers = asyncio.run(all_at_once())
    assert len(commits) <= 2, f"{len(commits)} transactions for 40 beats"
    assert all(a is not None and not a.cancel for a in answers)
