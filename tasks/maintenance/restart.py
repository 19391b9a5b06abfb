"""What a worker restarted under the same node name takes back from its previous life.

A killed worker's claimed attempts that never launched wait out their lease (20 s by
default) before the reaper adopts them. A node that starts again knows its previous life
is over, so it ends those leases at once and the next reaper pass retries them (nothing
of the customer's ran: their launch was never recorded). A launched attempt is left to
its runner, which does not need its worker, unless its sandbox on this host shows that
no process was ever started there (the worker died between recording the launch and
exec): that one would otherwise wait out its first heartbeat deadline, and it is handed
to the reaper at once. Were two live workers given one node name, the fence would still
keep the other one's attempt from launching twice.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa

from models import Attempt, db_now
from tasks.constants import AttemptState
from tasks.execution.inspect import poll
from tasks.sandbox import ProviderError
from tasks.sandbox.runtime import host_queue, provider
from tasks.store.db import session_scope
from tasks.store.fence import lock_run

log = logging.getLogger("playrun.restart")

BATCH = 200


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _owned(node: str) -> sa.ColumnElement[bool]:
    return Attempt.worker_id.like(_escaped(node) + ":%", escape="\\")


def _end(run_id: str, *conditions: sa.ColumnElement[bool]) -> bool:
    with session_scope() as session:
        lock_run(session, run_id)  # the run row first, as every writer takes them
        changed = session.execute(
            sa.update(Attempt).where(Attempt.run_id == run_id, Attempt.state == AttemptState.ACTIVE,
                                     Attempt.lease_expires_at > db_now(), *conditions)
            .values(lease_expires_at=db_now())).rowcount  # type: ignore[attr-defined]
    return bool(changed)


def end_previous_leases(node: str, limit: int = BATCH) -> list[str]:
    """End the leases of unlaunched attempts a previous life of `node` claimed, and of
    launched ones whose runner never started; returns their run ids. Called before this
    life has claimed anything."""
    owned = _owned(node)
    with session_scope(readonly=True) as session:
        run_ids = list(session.scalars(
            sa.select(Attempt.run_id).where(owned, Attempt.state == AttemptState.ACTIVE,
                                            Attempt.runner_started_at.is_(None))
            .limit(limit)))
    ended = [run_id for run_id in run_ids
             if _end(run_id, owned, Attempt.runner_started_at.is_(None))]
    return ended + _never_started(node, limit)


def _never_started(node: str, limit: int) -> list[str]:
    """Launched by a previous life, never heard from, and nothing ever started in a
    sandbox this worker can read: the reaper's inspection will find the same."""
    owned = _owned(node)
    with session_scope(readonly=True) as session:
        rows = session.execute(
            sa.select(Attempt.run_id, Attempt.launch_id, Attempt.provider, Attempt.sandbox_id,
                      Attempt.host_queue)
            .where(owned, Attempt.state == AttemptState.ACTIVE,
                   Attempt.runner_started_at.is_not(None),
                   Attempt.last_heartbeat_at.is_(None), Attempt.sandbox_id.is_not(None))
            .limit(limit)).all()
    ended = []
    for run_id, launch_id, name, sandbox_id, queue in rows:
        if name is None or sandbox_id is None or queue != host_queue(name):
            continue  # another host's sandbox: only its own workers can look
        try:
            started = poll(provider(name), sandbox_id).state != "never_started"
        except ProviderError:
            continue  # unreadable now: its heartbeat deadline still applies
        if not started and _end(run_id, owned, Attempt.launch_id == launch_id,
                                Attempt.last_heartbeat_at.is_(None)):
            ended.append(run_id)
    return ended
