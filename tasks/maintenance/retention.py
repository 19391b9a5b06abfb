"""Retention: ended runs with everything they left, and released receipts, deleted
oldest first in bounded batches (docs/operations.md#retention).

A run goes only when it is terminal, finished before the cut-off and holds nothing: no
active attempt, no reserved or live capacity lease, no sandbox not yet deleted, no unsent
outbox row and no pending or running receipt. Its ledger, deliveries, attempts, outbox
rows, sandboxes, leases and sheet write intents go in the same transaction, before it.
Sheets and their rows are the org's data and stay; so do completed receipts (reused by
later runs), play bundles and org settings. Each batch locks its runs (SKIP LOCKED on
PostgreSQL: a run some writer holds waits for the next pass) and walks the partial
indexes of migration 0013 by (finished_at, id), so a batch costs the same at any size.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import (
    Attempt,
    Base,
    CapacityLease,
    EventDelivery,
    Outbox,
    Run,
    RunEvent,
    RuntimeResource,
    SheetWriteIntent,
    UTCDateTime,
    WorkReceipt,
    db_now,
)
from tasks.constants import (
    LEASE_HELD,
    RECEIPT_HELD,
    TERMINAL_STATUSES,
    AttemptState,
    ReceiptState,
    SandboxState,
)
from tasks.errors import PruneExportError
from tasks.store.db import is_postgres, session_scope

log = logging.getLogger("playrun.retention")

# What an ended run leaves, each found by its run id; deleted before the run itself.
RUN_CHILDREN: tuple[type[Base], ...] = (RunEvent, EventDelivery, Attempt, Outbox,
                                        RuntimeResource, CapacityLease, SheetWriteIntent)
TABLES: tuple[str, ...] = (*(m.__tablename__ for m in RUN_CHILDREN), Run.__tablename__,
                           WorkReceipt.__tablename__)


@dataclass
class PruneReport:
    """Rows deleted per table (on a dry run: rows that would be), and the batches taken."""

    dry_run: bool
    deleted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    batch_ms: list[float] = field(default_factory=list)
    # False when the pass stopped at its batch limit with more left to delete.
    complete: bool = True


class _Export:
    """One JSON line per row, a file per table; flushed to disk before the batch commits."""

    def __init__(self, directory: Path) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / ".playrun-prune"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise PruneExportError(f"cannot write to {str(directory)!r}: {exc}") from exc
        self.directory = directory

    def write(self, table: str, rows: Sequence[sa.RowMapping]) -> None:
        if not rows:
            return
        try:
            with open(self.directory / f"{table}.jsonl", "a", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(dict(row), default=_plain, ensure_ascii=False,
                                       sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # the batch rolls back: nothing is deleted unexported
            raise PruneExportError(f"cannot write {table}.jsonl: {exc}") from exc


def _plain(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _take(session: Session, table: sa.Table, where: sa.ColumnElement[bool], *,
          dry_run: bool, export: _Export | None) -> int:
    """Delete (or, dry, count) the rows; an export gets exactly the rows deleted."""
    if dry_run:
        if export is None:
            return int(session.scalar(sa.select(sa.func.count()).select_from(table)
                                      .where(where)) or 0)
        rows = session.execute(sa.select(*table.c).where(where)).mappings().all()
    elif export is None:
        return int(session.execute(sa.delete(table).where(where),
                                   execution_options={"synchronize_session": False}
                                   ).rowcount or 0)  # type: ignore[attr-defined]
    else:
        rows = session.execute(sa.delete(table).where(where).returning(*table.c),
                               execution_options={"synchronize_session": False}
                               ).mappings().all()
    export.write(table.name, rows)
    return len(rows)


def _key(after: tuple[datetime, str]) -> sa.Tuple:
    """A keyset position, its time bound as the columns store it (naive UTC on SQLite)."""
    return sa.tuple_(sa.literal(after[0], UTCDateTime()), sa.literal(after[1]))


def _runs_batch(cutoff: datetime, after: tuple[datetime, str] | None, limit: int,
                lock: bool) -> sa.Select[str, datetime | None]:
    holds = (
        sa.exists().where(Attempt.run_id == Run.id, Attempt.state == AttemptState.ACTIVE),
        sa.exists().where(CapacityLease.run_id == Run.id, CapacityLease.state.in_(LEASE_HELD)),
        sa.exists().where(RuntimeResource.run_id == Run.id,
                          RuntimeResource.state != SandboxState.DELETED),
        sa.exists().where(Outbox.run_id == Run.id, Outbox.sent_at.is_(None)),
        sa.exists().where(WorkReceipt.owner_run_id == Run.id,
                          WorkReceipt.status.in_(RECEIPT_HELD)),
    )
    stmt = (sa.select(Run.id, Run.finished_at)
            .where(Run.finished_at.is_not(None), Run.finished_at < cutoff,
                   Run.status.in_(TERMINAL_STATUSES), *(~h for h in holds))
            .order_by(Run.finished_at, Run.id).limit(limit))
    if after is not None:
        stmt = stmt.where(sa.tuple_(Run.finished_at, Run.id) > _key(after))
    # A run some writer holds is left for the next pass instead of waited for.
    return stmt.with_for_update(skip_locked=True, of=Run) if lock else stmt


def _prune_runs(session: Session, cutoff: datetime, after: tuple[datetime, str] | None,
                batch: int, report: PruneReport, export: _Export | None
                ) -> tuple[datetime, str] | None:
    """One batch of ended runs; returns the last (finished_at, id) taken, None when done."""
    lock = is_postgres(session) and not report.dry_run
    found = session.execute(_runs_batch(cutoff, after, batch, lock)).all()
    if not found:
        return None
    ids = [row[0] for row in found]
    for model in RUN_CHILDREN:
        table = model.__table__
        assert isinstance(table, sa.Table)
        report.deleted[table.name] += _take(session, table, table.c.run_id.in_(ids),
                                            dry_run=report.dry_run, export=export)
    runs = Run.__table__
    assert isinstance(runs, sa.Table)
    report.deleted[runs.name] += _take(session, runs, runs.c.id.in_(ids),
                                       dry_run=report.dry_run, export=export)
    last_id, last_at = found[-1][0], found[-1][1]
    assert last_at is not None  # the query asked for finished runs
    return last_at, last_id


def _prune_receipts(session: Session, cutoff: datetime, after: tuple[datetime, str] | None,
                    batch: int, report: PruneReport, export: _Export | None
                    ) -> tuple[datetime, str] | None:
    """One batch of receipts released before the cut-off (a claim may take one back)."""
    released = sa.and_(WorkReceipt.status == ReceiptState.RELEASED,
                       WorkReceipt.released_at.is_not(None), WorkReceipt.released_at < cutoff)
    stmt = (sa.select(WorkReceipt.receipt_key, WorkReceipt.released_at).where(released)
            .order_by(WorkReceipt.released_at, WorkReceipt.receipt_key).limit(batch))
    if after is not None:
        stmt = stmt.where(sa.tuple_(WorkReceipt.released_at, WorkReceipt.receipt_key)
                          > _key(after))
    if is_postgres(session) and not report.dry_run:
        stmt = stmt.with_for_update(skip_locked=True)
    found = session.execute(stmt).all()
    if not found:
        return None
    table = WorkReceipt.__table__
    assert isinstance(table, sa.Table)
    keys = [row[0] for row in found]
    report.deleted[table.name] += _take(
        session, table, sa.and_(table.c.receipt_key.in_(keys), released),
        dry_run=report.dry_run, export=export)
    last_key, last_at = found[-1][0], found[-1][1]
    assert last_at is not None  # the query asked for released ones
    return last_at, last_key


def prune(older_than_s: float, *, batch: int, max_batches: int | None = None,
          dry_run: bool = False, export_dir: Path | None = None) -> PruneReport:
    """Delete what ended more than `older_than_s` ago by the database clock; a batch is
    one transaction of at most `batch` runs (then receipts), and a pass takes at most
    `max_batches` batches (None: until nothing is left)."""
    report = PruneReport(dry_run=dry_run)
    export = _Export(export_dir) if export_dir is not None else None
    with session_scope(readonly=True) as session:
        cutoff = session.scalar(sa.select(db_now(-older_than_s)))
    assert isinstance(cutoff, datetime)
    for step in (_prune_runs, _prune_receipts):
        after: tuple[datetime, str] | None = None
        while True:
            if max_batches is not None and len(report.batch_ms) >= max_batches:
                report.complete = False
                return report
            started = time.perf_counter()
            # A dry run reads only: no write lock on SQLite, no row locks on PostgreSQL.
            with session_scope(readonly=dry_run) as session:
                after = step(session, cutoff, after, batch, report, export)
            if after is None:
                break
            report.batch_ms.append((time.perf_counter() - started) * 1000)
    if any(report.deleted.values()) and not dry_run:
        log.info("retention deleted %s", {t: n for t, n in report.deleted.items() if n})
    return report
