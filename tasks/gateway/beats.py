"""Heartbeats answered in batches: one transaction for every beat that arrives in a window.

A running play beats every few seconds; answering each beat with its own transaction
would make a thousand running plays cost PostgreSQL hundreds of commits a second. The
batcher runs at most one transaction per `window_s`, so the commit rate is bounded by
the gateway, not by the number of plays. A beat waits at most one window for its answer.
The fence is the same as a single beat's: launch, generation and state are checked in
the batch's statements, and the renewal is a conditional UPDATE of those same rows.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import Attempt, Run, db_now
from tasks.constants import TERMINAL_STATUSES, AttemptState
from tasks.store.db import session_scope
from tasks.store.fence import LaunchFence

# At most one lease write per this many seconds per running play (<= 0.1 writes/s).
RENEW_EVERY_S = 10.0
MAX_BATCH = 500
# A beat that gets no answer in this long is answered "unavailable" (the runner retries).
ANSWER_TIMEOUT_S = 10.0


def renew_every(timeout_s: float) -> float:
    return min(RENEW_EVERY_S, timeout_s / 3)


@dataclass(frozen=True)
class BeatAnswer:
    cancel: bool
    renewed: bool
    past_deadline: bool


def answer_beats(session: Session, fences: Sequence[LaunchFence],
                 timeout_s: float) -> dict[LaunchFence, BeatAnswer]:
    """The answer for each fence that is still current; a fence missing from it is lost."""
    wanted = set(fences)
    keys = list({(f.run_id, f.generation) for f in wanted})
    rows = session.execute(
        sa.select(Attempt.run_id, Attempt.generation, Attempt.launch_id,
                  Run.status, Run.cancel_requested_at.is_not(None),
                  sa.func.coalesce(Attempt.runner_deadline < db_now(), False))
        .join(Run, Run.id == Attempt.run_id)
        .where(sa.tuple_(Attempt.run_id, Attempt.generation).in_(keys),
               Attempt.state == AttemptState.ACTIVE, Attempt.generation == Run.current_generation)
    ).all()
    live: dict[LaunchFence, tuple[bool, bool]] = {}
    for run_id, generation, launch_id, status, cancel, past in rows:
        fence = LaunchFence(run_id, generation, launch_id or "")
        if fence in wanted and status not in TERMINAL_STATUSES:
            live[fence] = (bool(cancel), bool(past))
    # Past its time limit a runner gets no more lease: it stops and the reaper inspects it.
    renew = [f for f, (_, past) in live.items() if not past]
    renewed: set[tuple[str, int]] = set()
    if renew:
        current = sa.select(Run.current_generation).where(Run.id == Attempt.run_id) \
            .scalar_subquery()
        renewed = {(r, g) for r, g in session.execute(
            sa.update(Attempt)
            .where(sa.tuple_(Attempt.run_id, Attempt.generation, Attempt.launch_id)
                   .in_([(f.run_id, f.generation, f.launch_id) for f in renew]),
                   Attempt.state == AttemptState.ACTIVE, Attempt.generation == current,
                   Attempt.lease_expires_at < db_now(timeout_s - renew_every(timeout_s)))
            .values(lease_expires_at=db_now(timeout_s), last_heartbeat_at=db_now(),
                    unreachable_at=None)
            .returning(Attempt.run_id, Attempt.generation)
            .execution_options(synchronize_session=False)
        ).all()}
    return {f: BeatAnswer(cancel, (f.run_id, f.generation) in renewed, past)
            for f, (cancel, past) in live.items()}


@dataclass
class _Pending:
    fence: LaunchFence
    done: threading.Event = field(default_factory=threading.Event)
    answer: BeatAnswer | None = None
    error: BaseException | None = None
    # Set for a beat awaited on the event loop: it holds no thread while it waits.
    future: asyncio.Future[BeatAnswer | None] | None = None

    def settle(self) -> None:
        if self.future is None:
            self.done.set()
        else:
            self.future.get_loop().call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        assert self.future is not None
        if self.future.done():
            return  # the request gave up waiting
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.answer)


class BeatBatcher:
    """Collects beats from the gateway's request threads and answers them together."""

    def __init__(self, timeout_s: float, window_s: float) -> None:
        self.timeout_s = timeout_s
        self.window_s = window_s
        self._queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._started = False
        self._lock = threading.Lock()

    def beat(self, fence: LaunchFence) -> BeatAnswer | None:
        """This beat's answer, None if the fence is lost; raises what the database raised."""
        self._start()
        pending = _Pending(fence)
        self._queue.put(pending)
        if not pending.done.wait(ANSWER_TIMEOUT_S):
            raise TimeoutError("no heartbeat answer in time")
        if pending.error is not None:
            raise pending.error
        return pending.answer

    async def beat_async(self, fence: LaunchFence) -> BeatAnswer | None:
        """As beat(), awaited on the event loop instead of holding a worker thread."""
        self._start()
        pending = _Pending(fence, future=asyncio.get_running_loop().create_future())
        self._queue.put(pending)
        assert pending.future is not None
        return await asyncio.wait_for(pending.future, ANSWER_TIMEOUT_S)

    def _start(self) -> None:
        with self._lock:
            if not self._started:
                threading.Thread(target=self._loop, name="playrun-beats", daemon=True).start()
                self._started = True

    def _collect(self, last_txn: float) -> list[_Pending]:
        batch = [self._queue.get()]
        # Wait out the rest of the window since the last transaction, taking what arrives.
        until = max(last_txn + self.window_s, time.monotonic())
        while len(batch) < MAX_BATCH:
            left = until - time.monotonic()
            try:
                batch.append(self._queue.get(timeout=left) if left > 0
                             else self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _loop(self) -> None:
        last_txn = 0.0
        while True:
            batch = self._collect(last_txn)
            last_txn = time.monotonic()
            try:
                # A lost renewal only shortens a lease: the reaper then finds it running.
                with session_scope(durable=False) as session:
                    answers = answer_beats(session, [p.fence for p in batch], self.timeout_s)
                for pending in batch:
                    pending.answer = answers.get(pending.fence)
            except Exception as exc:  # noqa: BLE001 -- each waiter re-raises it; the loop goes on
                for pending in batch:
                    pending.error = exc
            for pending in batch:
                pending.settle()
