"""Run again: a new run of an earlier run's play bundle and input, for the same org.

The stored bundle is reused (the play file may have changed or be absent where this
runs), in the same one transaction as a first submit: run, `run.admitted`, outbox row.
"""

from __future__ import annotations

import sqlalchemy as sa

from models import Run
from tasks.admission.rows import conflict, same_json
from tasks.admission.submit import Admitted, enqueue_start
from tasks.constants import EventKind, RunStatus
from tasks.errors import RunNotFoundError
from tasks.observe import metrics
from tasks.parse.checks import check_idempotency_key, check_run_id
from tasks.store import ledger
from tasks.store.db import after_commit, session_scope


def admit_again(run_id: str, idempotency_key: str | None) -> Admitted:
    """With a key this org already used, return that run and write nothing."""
    run_id = check_run_id(run_id)
    idempotency_key = check_idempotency_key(idempotency_key)
    try:
        with session_scope() as session:
            old = session.get(Run, run_id)
            if old is None:
                raise RunNotFoundError(f"no run with id {run_id}")
            if idempotency_key is not None:
                earlier = session.scalars(sa.select(Run).where(
                    Run.org_id == old.org_id, Run.idempotency_key == idempotency_key)).first()
                if earlier is not None:
                    if earlier.play_digest != old.play_digest or not same_json(earlier.input,
                                                                               old.input):
                        raise conflict(earlier.id, idempotency_key)
                    return Admitted(earlier.id, created=False, outbox_id=None)
            run = Run(org_id=old.org_id, play_path=old.play_path, play_digest=old.play_digest,
                      idempotency_key=idempotency_key, input=old.input, status=RunStatus.QUEUED,
                      current_generation=0, deferral_count=0, deferral_total_ms=0)
            session.add(run)
            session.flush()
            ledger.append(session, run.id, EventKind.ADMITTED,
                          {"play_digest": old.play_digest, "idempotency_key": idempotency_key,
                           "play_path": old.play_path, "again_of": run_id})
            after_commit(session, metrics.run_admitted)
            return Admitted(run.id, created=True,
                            outbox_id=enqueue_start(session, run.id, run.org_id))
    except sa.exc.IntegrityError:
        # A concurrent run-again with the same key won: hand back its run.
        if idempotency_key is None:
            raise
        with session_scope(readonly=True) as session:
            org = sa.select(Run.org_id).where(Run.id == run_id).scalar_subquery()
            found = session.scalar(sa.select(Run.id).where(
                Run.org_id == org, Run.idempotency_key == idempotency_key))
        if found is None:
            raise
        return Admitted(found, created=False, outbox_id=None)
