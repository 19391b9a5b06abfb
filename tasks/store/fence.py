"""The fence: a write on behalf of an attempt commits only while that attempt is current.

Every fenced write locks the run row first, then the attempt row, in that order
everywhere, so a claim, a settlement and a heartbeat can never deadlock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import Attempt, Run, db_now
from tasks.constants import TERMINAL_STATUSES, AttemptState, EventKind
from tasks.errors import FenceLostError
from tasks.store.db import ASYNC_COMMIT_SQL, driver_cursor, sql_list


@dataclass(frozen=True)
class Fence:
    run_id: str
    generation: int
    lease_token: str


def lock_run(session: Session, run_id: str, *, skip_locked: bool = False) -> Run | None:
    """Lock and return the run row (SQLite's BEGIN IMMEDIATE already serialises)."""
    stmt = sa.select(Run).where(Run.id == run_id)
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=skip_locked)
    return session.scalars(stmt.execution_options(populate_existing=True)).first()


def _current(fence: Fence) -> sa.ColumnElement[bool]:
    return sa.and_(
        Attempt.run_id == fence.run_id,
        Attempt.generation == fence.generation,
        Attempt.lease_token == fence.lease_token,
        Attempt.state == AttemptState.ACTIVE,
        Attempt.lease_expires_at > db_now(),
    )


# Built once: the fence check runs several times per run, and building it costs more
# Python than the round trip it makes.
_HOLD = (
    sa.select(Run, Attempt)
    .join(Attempt, sa.and_(Attempt.run_id == Run.id,
                           Attempt.generation == sa.bindparam("generation"),
                           Attempt.lease_token == sa.bindparam("token"),
                           Attempt.state == AttemptState.ACTIVE,
                           Attempt.lease_expires_at > db_now()))
    .where(Run.id == sa.bindparam("run_id"), Run.current_generation == sa.bindparam("generation"))
    .with_for_update()
    .execution_options(populate_existing=True)
)


def hold(session: Session, fence: Fence, *, allow_terminal: bool = False) -> tuple[Run, Attempt]:
    """Check the fence inside the caller's transaction; raise FenceLostError if it fails.

    The check uses the database clock, and the row locks keep it true until commit. On
    PostgreSQL one statement locks both rows (the run's first: FOR UPDATE locks a join's
    rows in FROM order); only a failed check reads them again, to say what failed.
    """
    if session.get_bind().dialect.name == "postgresql":
        row = session.execute(_HOLD, {"run_id": fence.run_id, "generation": fence.generation,
                                      "token": fence.lease_token}).first()
        if row is not None and (allow_terminal or row[0].status not in TERMINAL_STATUSES):
            return row[0], row[1]
    run = lock_run(session, fence.run_id)
    if run is None or run.current_generation != fence.generation:
        raise FenceLostError(f"run {fence.run_id} generation {fence.generation} is not current")
    if run.status in TERMINAL_STATUSES and not allow_terminal:
        raise FenceLostError(f"run {fence.run_id} is already {run.status}")
    stmt = sa.select(Attempt).where(_current(fence))
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    attempt = session.scalars(stmt.execution_options(populate_existing=True)).first()
    if attempt is None:
        raise FenceLostError(
            f"attempt {fence.generation} of run {fence.run_id} lost its lease"
        )
    return run, attempt


def renew(session: Session, fence: Fence, lease_seconds: float) -> None:
    """Extend the lease of a held fence (call after hold(), same transaction)."""
    session.execute(
        sa.update(Attempt)
        .where(
            Attempt.run_id == fence.run_id,
            Attempt.generation == fence.generation,
            Attempt.lease_token == fence.lease_token,
        )
        .values(lease_expires_at=db_now(lease_seconds))
    )


@dataclass(frozen=True)
class LaunchFence:
    """A launched runner's identity: the gateway fences its writes on this."""

    run_id: str
    generation: int
    launch_id: str


def launch_filter(fence: LaunchFence) -> sa.ColumnElement[bool]:
    """Attempt rows that are this launch, still active, in the run's current generation."""
    current = sa.select(Run.current_generation).where(Run.id == fence.run_id) \
        .scalar_subquery()
    return sa.and_(Attempt.run_id == fence.run_id, Attempt.generation == fence.generation,
                   Attempt.launch_id == fence.launch_id, Attempt.state == AttemptState.ACTIVE,
                   Attempt.generation == current)


def hold_launch(session: Session, fence: LaunchFence, run: Run | None = None
                ) -> tuple[Run, Attempt]:
    """The fence for writes a runner makes through the gateway, in the caller's transaction.

    The runner's launch id, not the worker's lease token, names the writer: the reaper may
    adopt the attempt under a new token while the runner it launched is still the one
    running. Its silence is judged by the reaper (heartbeat deadline), not here.
    `run`: the run row the caller already locked in this transaction.
    """
    if run is None:
        run = lock_run(session, fence.run_id)
    if run is None or run.current_generation != fence.generation:
        raise FenceLostError(f"run {fence.run_id} generation {fence.generation} is not current")
    if run.status in TERMINAL_STATUSES:
        raise FenceLostError(f"run {fence.run_id} is already {run.status}")
    stmt = sa.select(Attempt).where(launch_filter(fence))
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    attempt = session.scalars(stmt.execution_options(populate_existing=True)).first()
    if attempt is None:
        raise FenceLostError(f"launch {fence.launch_id} of run {fence.run_id} is not current")
    return run, attempt


def held_sql(columns: str = "r.id", join: str = "", lock: str = "r, a") -> str:
    """The fence as a CTE body, for statements that check it themselves (params run, gen,
    token): the run row, then the current attempt (then what `join` adds), locked as
    hold() locks them."""
    return f"""
    SELECT {columns} FROM runs r
    JOIN attempts a ON a.run_id = r.id AND a.generation = r.current_generation {join}
    WHERE r.id = %(run)s AND r.current_generation = %(gen)s AND a.lease_token = %(token)s
      AND a.state = '{AttemptState.ACTIVE}' AND a.lease_expires_at > clock_timestamp()
      AND r.status NOT IN ({sql_list(TERMINAL_STATUSES)})
    FOR UPDATE OF {lock}
"""


HELD_SQL = held_sql()


def held_launch_sql(columns: str = "r.id") -> str:
    """The launch fence (hold_launch) as a CTE body, params run, gen, launch: the run row
    and the attempt of this launch, locked; nothing when a cancel is recorded (the
    general transaction answers that case)."""
    return f"""
    SELECT {columns} FROM runs r
    JOIN attempts a ON a.run_id = r.id AND a.generation = r.current_generation
    WHERE r.id = %(run)s AND r.current_generation = %(gen)s AND a.launch_id = %(launch)s
      AND a.state = '{AttemptState.ACTIVE}' AND r.cancel_requested_at IS NULL
      AND r.status NOT IN ({sql_list(TERMINAL_STATUSES)})
    FOR UPDATE OF r, a
"""


def fence_params(fence: Fence) -> dict[str, Any]:
    return {"run": fence.run_id, "gen": fence.generation, "token": fence.lease_token}


# One autocommit statement: the event is written only while the fence holds, and its
# commit does not wait for the WAL flush (a lost event of this kind is harmless: the
# durable launch record that follows flushes it anyway).
_APPEND_IF_CURRENT = f"""
WITH quick AS ({ASYNC_COMMIT_SQL}), held AS ({HELD_SQL})
INSERT INTO run_events (run_id, generation, kind, data, at)
SELECT held.id, %(gen)s, %(kind)s, %(data)s::jsonb,
       clock_timestamp() - make_interval(secs => %(ago)s) FROM held, quick
RETURNING id
"""


def append_if_current(fence: Fence, kind: EventKind, data: dict[str, Any],
                      ago_s: float = 0.0) -> bool:
    """PostgreSQL: append a ledger event in one round trip if the fence holds; False if it
    does not (nothing written). `ago_s`: the event happened that long before. Elsewhere
    the caller uses hold() + ledger.append."""
    with driver_cursor() as cur:
        cur.execute(_APPEND_IF_CURRENT, {**fence_params(fence), "kind": kind,
                                         "data": json.dumps(data), "ago": float(ago_s)})
        return cur.fetchone() is not None
