"""submit_run: one transaction writes bundle, run, `run.admitted` and the outbox row."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from models import Outbox, PlayBundle, Run, db_now
from tasks import ledger, metrics
from tasks.admission.validate import (
    check_idempotency_key,
    check_input,
    check_org_id,
    load_play,
)
from tasks.constants import EV_ADMITTED, QUEUED, TASK_START_ATTEMPT
from tasks.db import after_commit, is_postgres, session_scope

log = logging.getLogger("playrun.admission")


@dataclass(frozen=True)
class Admitted:
    run_id: str
    created: bool
    outbox_id: str | None


def _existing(session: Session, org_id: str, key: str) -> str | None:
    return session.scalar(
        sa.select(Run.id).where(Run.org_id == org_id, Run.idempotency_key == key)
    )


def _insert_bundle(session: Session, digest: str, source: str) -> None:
    insert = pg_insert if is_postgres(session) else sqlite_insert
    session.execute(
        insert(PlayBundle)
        .values(digest=digest, source=source, size=len(source.encode()))
        .on_conflict_do_nothing(index_elements=["digest"])
    )


def enqueue_start(session: Session, run_id: str, *, delay_s: float = 0.0) -> str:
    """Add a start_attempt outbox row (published after commit, or by the sweep when due)."""
    outbox_id = str(uuid.uuid4())
    session.add(Outbox(
        id=outbox_id, run_id=run_id, task_name=TASK_START_ATTEMPT, args=[run_id],
        available_at=db_now(delay_s),
    ))
    return outbox_id


def admit(play: str | Path, input: Any, org_id: str, idempotency_key: str | None) -> Admitted:
    """Validate everything (tasks.admission.validate), then write it in one transaction."""
    org_id = check_org_id(org_id)
    idempotency_key = check_idempotency_key(idempotency_key)
    value = check_input(input)
    bundle = load_play(play)
    try:
        with session_scope() as session:
            if idempotency_key is not None:
                found = _existing(session, org_id, idempotency_key)
                if found is not None:
                    return Admitted(found, created=False, outbox_id=None)
            _insert_bundle(session, bundle.digest, bundle.source)
            run = Run(
                org_id=org_id, play_path=bundle.path, play_digest=bundle.digest,
                idempotency_key=idempotency_key, input=value, status=QUEUED,
                current_generation=0, deferral_count=0, deferral_total_ms=0,
            )
            session.add(run)
            session.flush()
            ledger.append(session, run.id, EV_ADMITTED,
                          {"play_digest": bundle.digest, "idempotency_key": idempotency_key,
                           "play_path": bundle.path})
            outbox_id = enqueue_start(session, run.id)
            after_commit(session, metrics.run_admitted)
            return Admitted(run.id, created=True, outbox_id=outbox_id)
    except sa.exc.IntegrityError:
        # A concurrent submit with the same key won the unique constraint: return its run.
        if idempotency_key is None:
            raise
        with session_scope() as session:
            found = _existing(session, org_id, idempotency_key)
        if found is None:
            raise
        return Admitted(found, created=False, outbox_id=None)
