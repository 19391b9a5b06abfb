"""Runtime sheets as app code and the CLI read them: rows in key order, counts, export."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from models import Sheet, SheetRow, SheetWriteIntent
from tasks.constants import SheetRowStatus
from tasks.sheets.store import find_sheet, play_name
from tasks.store.db import ensure_schema_once, session_scope

EXPORT_COLUMNS = ("key", "status", "write_version", "data", "result", "error", "updated_at")


@dataclass(frozen=True)
class SheetRowView:
    """One row of a runtime sheet: its key, the data the play admitted, its result or
    error, its status and the write version that admitted it."""

    key: str
    data: Any
    result: Any
    status: SheetRowStatus
    write_version: int
    error: str | None
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "status": self.status, "write_version": self.write_version,
                "data": self.data, "result": self.result, "error": self.error,
                "updated_at": self.updated_at.isoformat()}


@dataclass(frozen=True)
class VersionView:
    version: int
    run_id: str
    kind: str
    rows: int  # rows this version owns now


@dataclass(frozen=True)
class SheetSummary:
    org_id: str
    play: str
    table: str
    total: int
    by_status: dict[str, int]
    versions: list[VersionView]


def _play(play: str) -> str:
    """A play name, or a play's path (`plays/enrich.py` names `enrich`)."""
    return play_name(play) if play.endswith(".py") or "/" in play else play


def iter_sheet_rows(org_id: str, play: str, table: str, *,
                    batch: int = 1000) -> Iterator[SheetRowView]:
    """Every row of a sheet in key order, read in keyset pages (bounded memory)."""
    ensure_schema_once()
    after: str | None = None
    while True:
        with session_scope(readonly=True) as session:
            sheet_id = find_sheet(session, org_id, _play(play), table)
            if sheet_id is None:
                return
            stmt = sa.select(SheetRow).where(SheetRow.sheet_id == sheet_id) \
                .order_by(SheetRow.key).limit(batch)
            if after is not None:
                stmt = stmt.where(SheetRow.key > after)
            page = [SheetRowView(r.key, r.data, r.result, SheetRowStatus(r.status),
                                 r.write_version, r.error, r.updated_at)
                    for r in session.scalars(stmt)]
        yield from page
        if len(page) < batch:
            return
        after = page[-1].key


def sheet_rows(org_id: str, play: str, table: str) -> list[SheetRowView]:
    """The rows of (org, play, table) in key order; [] when no run has made the sheet."""
    return list(iter_sheet_rows(org_id, play, table))


def summary(org_id: str, play: str, table: str) -> SheetSummary | None:
    ensure_schema_once()
    with session_scope(readonly=True) as session:
        sheet = session.scalars(sa.select(Sheet).where(
            Sheet.org_id == org_id, Sheet.play == _play(play), Sheet.name == table)).first()
        if sheet is None:
            return None
        by_status: dict[str, int] = dict.fromkeys(SheetRowStatus, 0)
        for status, count in session.execute(
                sa.select(SheetRow.status, sa.func.count()).where(SheetRow.sheet_id == sheet.id)
                .group_by(SheetRow.status)):
            by_status[status] = int(count)
        owned = dict(session.execute(
            sa.select(SheetRow.write_version, sa.func.count())
            .where(SheetRow.sheet_id == sheet.id).group_by(SheetRow.write_version)).all())
        versions = [VersionView(v.version, v.run_id, v.kind, int(owned.get(v.version, 0)))
                    for v in session.scalars(
                        sa.select(SheetWriteIntent).where(SheetWriteIntent.sheet_id == sheet.id)
                        .order_by(SheetWriteIntent.version))]
        return SheetSummary(org_id, sheet.play, table, sum(by_status.values()), by_status,
                            versions)


def export_lines(org_id: str, play: str, table: str, fmt: str) -> Iterator[str]:
    """The sheet as CSV (header first; JSON cells for data and result) or JSON lines."""
    if fmt == "jsonl":
        for row in iter_sheet_rows(org_id, play, table):
            yield json.dumps(row.as_dict(), ensure_ascii=False) + "\n"
        return
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")

    def take() -> str:
        text = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return text

    writer.writerow(EXPORT_COLUMNS)
    yield take()
    for row in iter_sheet_rows(org_id, play, table):
        writer.writerow([row.key, row.status, row.write_version,
                         json.dumps(row.data, ensure_ascii=False),
                         "" if row.result is None and row.status != SheetRowStatus.DONE
                         else json.dumps(row.result, ensure_ascii=False),
                         row.error or "", row.updated_at.isoformat()])
        yield take()
