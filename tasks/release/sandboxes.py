"""Delete an attempt's sandboxes and record it; a failure is logged and left to GC."""

from __future__ import annotations

import logging

import sqlalchemy as sa

from models import RuntimeResource, db_now
from tasks import ledger
from tasks.constants import EV_SANDBOX_DELETED, RESOURCE_DELETED
from tasks.db import session_scope
from tasks.errors import PlayrunError
from tasks.fence import lock_run
from tasks.runtime import provider

log = logging.getLogger("playrun.release")


def delete_resource(resource_id: str, provider_name: str, sandbox_id: str, run_id: str,
                    generation: int) -> bool:
    """Delete one sandbox at its provider, then mark it deleted (once). True if deleted."""
    try:
        provider(provider_name).delete(sandbox_id)
    except (PlayrunError, OSError) as exc:
        log.warning("sandbox %s of run %s not deleted yet: %s", sandbox_id, run_id, exc)
        with session_scope() as session:
            session.execute(sa.update(RuntimeResource).where(
                RuntimeResource.id == resource_id).values(last_error=str(exc)[:2000],
                                                          updated_at=db_now()))
        return False
    # Not durable: if a crash loses the mark, GC finds the sandbox gone and marks it again.
    with session_scope(durable=False) as session:
        lock_run(session, run_id)  # run row first, as every writer does: no deadlock
        changed = session.execute(
            sa.update(RuntimeResource)
            .where(RuntimeResource.id == resource_id, RuntimeResource.state != RESOURCE_DELETED)
            .values(state=RESOURCE_DELETED, deleted_at=db_now(), updated_at=db_now())
        ).rowcount  # type: ignore[attr-defined]
        if changed:
            ledger.append(session, run_id, EV_SANDBOX_DELETED, {"sandbox_id": sandbox_id},
                          generation)
    return True


def release_sandboxes(run_id: str, generation: int, token: str) -> int:
    """Delete every sandbox this holder still has; returns how many are left undeleted."""
    with session_scope() as session:
        rows = session.execute(
            sa.select(RuntimeResource.id, RuntimeResource.provider, RuntimeResource.sandbox_id)
            .where(RuntimeResource.run_id == run_id, RuntimeResource.generation == generation,
                   RuntimeResource.holder_token == token,
                   RuntimeResource.state != RESOURCE_DELETED)
        ).all()
    left = 0
    for rid, prov, sid in rows:
        if not delete_resource(rid, prov, sid, run_id, generation):
            left += 1
    return left
