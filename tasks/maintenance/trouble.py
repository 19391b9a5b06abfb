"""Bounded patience with one run: maintenance that keeps failing on it fails the run.

A reaper pass or an inspection that raises for one run must not retry it forever
while it holds a capacity slot; after MAX_PASSES failures the run is settled
RUNTIME_INTERNAL_ERROR with the reason in the ledger, and its rows are released.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa

from models import Run
from tasks.constants import RUNTIME_INTERNAL_ERROR, EventKind
from tasks.parse.untrusted import storable_text
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle_forced
from tasks.store import ledger
from tasks.store.db import session_scope
from tasks.store.fence import lock_run

log = logging.getLogger("playrun.trouble")

MAX_PASSES = 5


def describe(exc: BaseException) -> str:
    return storable_text(f"{type(exc).__name__}: {exc}")[:500]


def note_failure(run_id: str, exc: BaseException, where: str) -> bool:
    """Count one failed pass for the run; True if it was failed for good."""
    log.warning("%s failed for run %s: %s", where, run_id, describe(exc))
    try:
        with session_scope() as session:
            run = lock_run(session, run_id)
            if run is None:
                return False
            passes = session.scalar(
                sa.update(Run).where(Run.id == run_id)
                .values(trouble_count=Run.trouble_count + 1).returning(Run.trouble_count))
            ledger.append(session, run_id, EventKind.MAINTENANCE_FAILED,
                          {"where": where, "error": describe(exc), "pass": passes})
        if passes is None or passes < MAX_PASSES:
            return False
        settle_forced(run_id, Outcome.failed(
            RUNTIME_INTERNAL_ERROR,
            f"{where} failed {passes} times for this run; last: {describe(exc)}"),
            reason="maintenance_failed")
        return True
    except Exception:
        log.exception("cannot record the failure of run %s", run_id)
        return False
