"""Delete an attempt's sandboxes and record it; a failure is logged and left to GC."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from models import RuntimeResource, db_now
from tasks.constants import EventKind, SandboxState
from tasks.errors import PlayrunError
from tasks.release.after_delete import mark_and_release
from tasks.sandbox.runtime import provider
from tasks.store import ledger
from tasks.store.db import ASYNC_COMMIT_SQL, autocommit, driver_cursor, get_engine, session_scope
from tasks.store.fence import lock_run

log = logging.getLogger("playrun.release")


# One autocommit statement, its commit not waiting for the WAL flush: if a crash loses the
# mark, GC finds the sandbox gone and marks it again. The run row is locked first, as
# every writer does (the update joins it), and the event is written once, with the mark.
_PG_MARK_DELETED = f"""
WITH quick AS ({ASYNC_COMMIT_SQL}), run AS (
    SELECT id FROM runs WHERE id = %(run)s FOR UPDATE
), gone AS (
    UPDATE runtime_resources AS r SET state = '{SandboxState.DELETED}',
        deleted_at = clock_timestamp(), updated_at = clock_timestamp()
    FROM run, quick
    WHERE r.id = %(rid)s AND r.run_id = run.id AND r.state <> '{SandboxState.DELETED}'
    RETURNING r.id
)
INSERT INTO run_events (run_id, generation, kind, data)
SELECT %(run)s, %(gen)s, '{EventKind.SANDBOX_DELETED}',
       jsonb_build_object('sandbox_id', %(sid)s::text)
FROM gone
"""


def delete_resource(resource_id: str, provider_name: str, sandbox_id: str, run_id: str,
                    generation: int) -> bool:
    """Delete one sandbox at its provider, then mark it deleted (once). True if deleted."""
    if not deleted_at_provider(resource_id, provider_name, sandbox_id, run_id):
        return False
    if get_engine().dialect.name == "postgresql":
        with driver_cursor() as cur:
            cur.execute(_PG_MARK_DELETED, {"run": run_id, "gen": generation,
                                           "rid": resource_id, "sid": sandbox_id})
        return True
    with session_scope() as session:
        lock_run(session, run_id)  # run row first, as every writer does: no deadlock
        changed = session.execute(
            sa.update(RuntimeResource)
            .where(RuntimeResource.id == resource_id, RuntimeResource.state != SandboxState.DELETED)
            .values(state=SandboxState.DELETED, deleted_at=db_now(), updated_at=db_now())
        ).rowcount  # type: ignore[attr-defined]
        if changed:
            ledger.append(session, run_id, EventKind.SANDBOX_DELETED, {"sandbox_id": sandbox_id},
                          generation)
    return True


def deleted_at_provider(resource_id: str, provider_name: str, sandbox_id: str,
                         run_id: str) -> bool:
    try:
        provider(provider_name).delete(sandbox_id)
    except (PlayrunError, OSError) as exc:
        log.warning("sandbox %s of run %s not deleted yet: %s", sandbox_id, run_id, exc)
        with session_scope() as session:
            session.execute(sa.update(RuntimeResource).where(
                RuntimeResource.id == resource_id).values(last_error=str(exc)[:2000],
                                                          updated_at=db_now()))
        return False
    return True


_UNDELETED = (
    sa.select(RuntimeResource.id, RuntimeResource.provider, RuntimeResource.sandbox_id)
    .where(RuntimeResource.run_id == sa.bindparam("run"),
           RuntimeResource.generation == sa.bindparam("gen"),
           RuntimeResource.holder_token == sa.bindparam("token"),
           RuntimeResource.state != SandboxState.DELETED)
)


_PG_UNDELETED = f"""
SELECT id, provider, sandbox_id FROM runtime_resources
WHERE run_id = %(run)s AND generation = %(gen)s AND holder_token = %(token)s
  AND state <> '{SandboxState.DELETED}'
"""


@dataclass(frozen=True)
class Released:
    left: int  # sandboxes not deleted yet
    leases_released: bool = False  # with_leases, and done with the last mark: nothing left


def release_sandboxes(run_id: str, generation: int, token: str, *,
                      with_leases: bool = False,
                      known: tuple[str, str, str] | None = None) -> Released:
    """Delete every sandbox this holder still has. `with_leases`: on PostgreSQL, a lone
    sandbox's mark also releases the holder's leases unless it holds receipts
    (after_delete.py), one statement where there were three. `known`: the holder's only
    sandbox (id, provider, sandbox id) as the terminal's write read it; not read again."""
    postgres = get_engine().dialect.name == "postgresql"
    params = {"run": run_id, "gen": generation, "token": token}
    if known is not None and postgres:
        rows: Sequence[Any] = [known]
    elif postgres:  # a plain read in autocommit: one round trip, no BEGIN or COMMIT
        with driver_cursor() as cur:
            cur.execute(_PG_UNDELETED, params)
            rows = cur.fetchall()
    else:  # stays a write-locked read, as it was: the deletes follow
        with autocommit() as conn:
            rows = conn.execute(_UNDELETED, params).all()
    if with_leases and len(rows) == 1 and postgres:
        rid, prov, sid = rows[0]
        if not deleted_at_provider(rid, prov, sid, run_id):
            return Released(1)
        with driver_cursor() as cur:
            after = mark_and_release(cur, run_id=run_id, generation=generation, token=token,
                                     resource_id=rid, sandbox_id=sid)
        return Released(0, leases_released=not after.receipts_held)
    left = 0
    for rid, prov, sid in rows:
        if not delete_resource(rid, prov, sid, run_id, generation):
            left += 1
    return Released(left)
