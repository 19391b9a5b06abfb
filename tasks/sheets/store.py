"""Runtime sheets in SQL: pages admitted under a write version, row writes fenced by it.

The gateway's sheet actions call these inside the transaction that holds the launch
fence. Locks are always taken in one order: run, attempt (the fence), sheet (its
version counter, only when a version is minted), then rows in ascending key order, so
concurrent admissions and writes of one sheet cannot deadlock.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from models import Sheet, SheetRow, SheetWriteIntent, db_now
from tasks.constants import SHEET_MAX_READ_BYTES, IntentKind, IntentStatus, SheetRowStatus
from tasks.errors import SheetWriteIntentInvalidError, SheetWriteVersionMismatchError
from tasks.parse.untrusted import encoded_size
from tasks.store.db import is_postgres

# Why a row write (or a row of an admitted page) was refused (docs/design.md).
NEWER = "newer_write_version"  # a later admission owns the row
OLDER = "older_write_version"  # the row was never admitted under the writer's version
ALREADY_TERMINAL = "already_terminal"  # same version, result already written: benign
UNREPORTED = "unreported"
# The rows' Core table: bulk statements skip the ORM's per-row bookkeeping.
ROWS = cast(sa.Table, SheetRow.__table__)


def play_name(play_path: str) -> str:
    """`plays/enrich.py` -> `enrich`: sheets and receipts are scoped by it."""
    return PurePosixPath(play_path.replace("\\", "/")).stem


def _insert(session: Session) -> Any:
    return pg_insert if is_postgres(session) else sqlite_insert


# --- sheets and versions ---------------------------------------------------------------

def find_sheet(session: Session, org_id: str, play: str, name: str) -> int | None:
    return session.scalar(sa.select(Sheet.id).where(
        Sheet.org_id == org_id, Sheet.play == play, Sheet.name == name))


def ensure_sheet(session: Session, org_id: str, play: str, name: str) -> int:
    found = find_sheet(session, org_id, play, name)
    if found is None:
        session.execute(_insert(session)(Sheet)
                        .values(org_id=org_id, play=play, name=name, last_version=0)
                        .on_conflict_do_nothing(index_elements=["org_id", "play", "name"]))
        found = find_sheet(session, org_id, play, name)
    assert found is not None
    return found


def mint_version(session: Session, sheet_id: int) -> int:
    """The sheet's next write version: newer than all before it (the row lock orders them)."""
    return int(session.execute(
        sa.update(Sheet).where(Sheet.id == sheet_id)
        .values(last_version=Sheet.last_version + 1)
        .returning(Sheet.last_version)
        .execution_options(synchronize_session=False)).scalar_one())


@dataclass(frozen=True)
class Resolved:
    version: int
    minted: bool  # this call stored the intent
    lost_race: bool  # a concurrent first admission stored it first; its version is used


def _stable_intent(session: Session, sheet_id: int, run_id: str) -> Any:
    return session.execute(
        sa.select(SheetWriteIntent.version, SheetWriteIntent.run_id, SheetWriteIntent.kind,
                  SheetWriteIntent.status)
        .where(SheetWriteIntent.sheet_id == sheet_id, SheetWriteIntent.intent_key == run_id)
    ).first()


def check_intent(intent: Any, run_id: str, table: str, caller_version: int | None) -> int:
    """The admitted version of a stored intent, or an error; never a silent overwrite."""
    if intent is None:
        raise SheetWriteIntentInvalidError(f"table {table!r} has no stored write intent "
                                           f"for run {run_id}")
    version, owner, kind, status = intent
    if owner != run_id:
        raise SheetWriteIntentInvalidError(
            f"the write intent of table {table!r} belongs to run {owner}, not {run_id}")
    if kind != IntentKind.STABLE or status != IntentStatus.ADMITTED:
        raise SheetWriteIntentInvalidError(
            f"the write intent of table {table!r} is {kind}/{status}, not "
            f"{IntentKind.STABLE}/{IntentStatus.ADMITTED}")
    if not isinstance(version, int) or isinstance(version, bool) or version <= 0:
        raise SheetWriteIntentInvalidError(
            f"the write intent of table {table!r} does not hold an admitted version")
    if caller_version is not None and caller_version != version:
        raise SheetWriteVersionMismatchError(
            f"write version {caller_version} disagrees with version {version} admitted "
            f"for table {table!r} by run {run_id}")
    return version


def resolve_stable_intent(session: Session, sheet_id: int, run_id: str, generation: int,
                          table: str, caller_version: int | None) -> Resolved:
    """The run's one write version for this sheet, stored on first admission.

    Insert-if-absent in the caller's transaction (so it commits with the page's rows);
    a losing concurrent insert re-reads the winner and never uses its own candidate.
    """
    intent = _stable_intent(session, sheet_id, run_id)
    minted = lost = False
    if intent is None:
        candidate = mint_version(session, sheet_id)
        intent = session.execute(
            _insert(session)(SheetWriteIntent)
            .values(sheet_id=sheet_id, version=candidate, run_id=run_id, generation=generation,
                    kind=IntentKind.STABLE, status=IntentStatus.ADMITTED, intent_key=run_id)
            .on_conflict_do_nothing(index_elements=["sheet_id", "intent_key"])
            .returning(SheetWriteIntent.version, SheetWriteIntent.run_id,
                       SheetWriteIntent.kind, SheetWriteIntent.status)).first()
        if intent is None:
            # The conflicting insert committed first; under READ COMMITTED only a new
            # statement sees it. The candidate is burnt: versions stay newer, not dense.
            intent = _stable_intent(session, sheet_id, run_id)
            lost = True
        else:
            minted = True
    return Resolved(check_intent(intent, run_id, table, caller_version), minted, lost)


def mint_legacy(session: Session, sheet_id: int, run_id: str, generation: int) -> int:
    """The legacy start: a fresh version on every call without one (a retry re-admits)."""
    version = mint_version(session, sheet_id)
    session.add(SheetWriteIntent(sheet_id=sheet_id, version=version, run_id=run_id,
                                 generation=generation, kind=IntentKind.LEGACY,
                                 status=IntentStatus.ADMITTED, intent_key=None))
    session.flush()
    return version


def admitted_version(session: Session, sheet_id: int | None, run_id: str, version: int,
                     table: str) -> int:
    """A caller's version must be one this run admitted for this table, and still open."""
    intent = None if sheet_id is None else session.execute(
        sa.select(SheetWriteIntent.run_id, SheetWriteIntent.status)
        .where(SheetWriteIntent.sheet_id == sheet_id, SheetWriteIntent.version == version)
    ).first()
    if intent is None or intent[0] != run_id:
        raise SheetWriteVersionMismatchError(
            f"write version {version} was never admitted by run {run_id} for table {table!r}")
    if intent[1] != IntentStatus.ADMITTED:
        raise SheetWriteIntentInvalidError(
            f"write version {version} of table {table!r} is {intent[1]}, "
            f"not {IntentStatus.ADMITTED}")
    return version


# --- rows as one parameter ------------------------------------------------------------

def _records(session: Session, items: list[dict[str, Any]], columns: tuple[str, ...]) -> Any:
    """A derived table of text columns from one JSON-array parameter: the statement is the
    same whatever the number of rows, so it is compiled once and planned cheaply."""
    doc = sa.bindparam("records", json.dumps(items, ensure_ascii=False, separators=(",", ":")),
                       type_=sa.Text)
    if is_postgres(session):
        return sa.func.jsonb_to_recordset(sa.cast(doc, JSONB)).table_valued(
            *(sa.column(c, sa.Text) for c in columns)).render_derived(name="r", with_types=True)
    each = sa.func.json_each(doc).table_valued("value").alias("e")
    return sa.select(*(sa.type_coerce(sa.func.json_extract(each.c.value, f"$.{c}"), sa.Text)
                       .label(c) for c in columns)).select_from(each).subquery("r")


def _json(session: Session, text: Any) -> Any:
    """JSON text as a value of the JSON columns (SQLite stores the text itself)."""
    if is_postgres(session):
        return sa.cast(text, JSONB)
    return sa.type_coerce(text, SheetRow.data.type)


def _key_order(session: Session, key: Any) -> Any:
    # Code point order: the rows' collation, so every statement locks rows in one order.
    return key.collate("C") if is_postgres(session) else key


def _lookup(session: Session, sheet_id: int, keys: Sequence[str], columns: Sequence[Any], *,
            lock: bool = False) -> list[Any]:
    """The rows of these keys (those that exist), in the order of `keys`.

    On PostgreSQL each key is its own primary-key probe (a LATERAL lookup): the planner
    cannot turn it into a scan of the whole sheet, whatever its statistics say about a
    sheet that grew a minute ago. With `lock`, rows are locked in the order of `keys`.
    """
    if not keys:
        return []
    if not is_postgres(session):
        recs = _records(session, [{"k": k} for k in keys], ("k",))
        found = {r.key: r for r in session.execute(
            sa.select(*columns).where(SheetRow.sheet_id == sheet_id,
                                      SheetRow.key.in_(sa.select(recs.c.k))))}
        return [found[k] for k in keys if k in found]
    wanted = sa.func.unnest(sa.bindparam("keys", list(keys), type_=ARRAY(sa.Text))) \
        .table_valued("key", with_ordinality="n").render_derived(name="k")
    probe = sa.select(*columns).where(SheetRow.sheet_id == sheet_id,
                                      SheetRow.key == wanted.c.key)
    if lock:
        probe = probe.with_for_update()
    row = probe.lateral("r")
    return list(session.execute(sa.select(*row.c).select_from(wanted)
                                .join(row, sa.true()).order_by(wanted.c.n)))


# --- admission -------------------------------------------------------------------------

@dataclass
class Admission:
    """A page's rows as the admission left them, for the runner."""

    version: int
    todo: list[str] = field(default_factory=list)  # admitted, no result yet under `version`
    done: list[dict[str, Any]] = field(default_factory=list)  # written under `version`
    superseded: list[dict[str, Any]] = field(default_factory=list)  # a newer version owns

    def as_dict(self, table: str) -> dict[str, Any]:
        return {"table": table, "write_version": self.version, "todo": self.todo,
                "done": self.done, "superseded": self.superseded}


def admit_page(session: Session, sheet_id: int, version: int,
               rows: Sequence[tuple[str, dict[str, Any]]]) -> Admission:
    """Admit rows under `version`: new rows are inserted, rows of older versions re-admitted
    (their results cleared), rows of this version kept, rows of newer versions left alone."""
    admission = Admission(version)
    if not rows:
        return admission
    recs = _records(session, [
        {"key": key, "data": json.dumps(data, ensure_ascii=False, separators=(",", ":"))}
        for key, data in sorted(rows, key=lambda r: r[0])], ("key", "data"))
    source = sa.select(sa.bindparam("sheet_id", sheet_id, type_=sa.BigInteger), recs.c.key,
                       _json(session, recs.c.data),
                       sa.bindparam("pending", SheetRowStatus.PENDING, type_=sa.String),
                       sa.bindparam("version", version, type_=sa.BigInteger)) \
        .order_by(_key_order(session, recs.c.key))
    if not is_postgres(session):
        source = source.where(sa.true())  # SQLite: an upsert's SELECT needs a WHERE
    insert = _insert(session)(ROWS).from_select(
        ["sheet_id", "key", "data", "status", "write_version"], source)
    session.execute(insert.on_conflict_do_update(
        index_elements=[ROWS.c.sheet_id, ROWS.c.key],
        set_={"data": insert.excluded.data, "status": SheetRowStatus.PENDING, "result": sa.null(),
              "error": None, "write_version": insert.excluded.write_version,
              "updated_at": db_now()},
        where=ROWS.c.write_version < insert.excluded.write_version))
    state = {r.key: r for r in _lookup(
        session, sheet_id, [key for key, _ in rows],
        (SheetRow.key, SheetRow.status, SheetRow.write_version, SheetRow.result,
         SheetRow.error))}
    budget = SHEET_MAX_READ_BYTES  # outcomes beyond it are left for the runner to read
    for key, _ in rows:
        row = state[key]
        if row.write_version > version:
            admission.superseded.append({"key": key, "reason": NEWER,
                                         "write_version": row.write_version})
        elif row.status == SheetRowStatus.PENDING:
            admission.todo.append(key)
        else:
            item: dict[str, Any] = {"key": key, "status": row.status}
            if row.status == SheetRowStatus.DONE:
                item["result"] = row.result
            else:
                item["error"] = row.error
            budget -= encoded_size(item)
            admission.done.append(item if budget >= 0 else
                                  {"key": key, "status": row.status, "omitted": True})
    return admission


# --- row writes ------------------------------------------------------------------------

@dataclass(frozen=True)
class RowWrite:
    key: str
    status: str  # done or failed
    result: Any = None
    error: str | None = None


def _reason(stamp: int | None, status: str | None, version: int) -> str:
    if stamp is None or stamp < version:
        return OLDER
    if stamp > version:
        return NEWER
    return ALREADY_TERMINAL if status != SheetRowStatus.PENDING else UNREPORTED


def write_rows(session: Session, sheet_id: int, version: int,
               rows: Sequence[RowWrite]) -> tuple[list[str], list[dict[str, Any]]]:
    """Write results of rows admitted under `version`; (written keys, rejected rows).

    The rows are locked in key order first (the lock order), then each is updated by a
    statement whose WHERE is the version fence, so a row another version owns is never
    touched; all of them in one round trip.
    """
    ordered = sorted(rows, key=lambda r: r.key)
    state = {r.key: (r.write_version, r.status) for r in _lookup(
        session, sheet_id, [r.key for r in ordered],
        (SheetRow.key, SheetRow.write_version, SheetRow.status), lock=is_postgres(session))}
    writable = [r for r in ordered if state.get(r.key) == (version, SheetRowStatus.PENDING)]
    if writable:
        fenced = sa.update(ROWS).where(
            ROWS.c.sheet_id == sheet_id, ROWS.c.key == sa.bindparam("k"),
            ROWS.c.write_version == version, ROWS.c.status == SheetRowStatus.PENDING,
        ).values(status=sa.bindparam("s"), error=sa.bindparam("e"), updated_at=db_now(),
                 result=sa.case((sa.bindparam("s") == SheetRowStatus.DONE,
                                 sa.bindparam("r", type_=ROWS.c.result.type)),
                                else_=sa.null()))
        changed = session.execute(fenced, [
            {"k": r.key, "s": r.status, "e": r.error, "r": r.result} for r in writable])
        # The rows are locked and were read pending under `version`: each update matched.
        if changed.rowcount != len(writable):  # type: ignore[attr-defined]
            raise RuntimeError(f"{changed.rowcount} of {len(writable)} fenced row writes "  # type: ignore[attr-defined]
                               "matched rows that were locked for them")
    written = {r.key for r in writable}
    rejected = []
    for r in rows:
        if r.key in written:
            continue
        stamp, status = state.get(r.key, (None, None))
        rejected.append({"key": r.key, "reason": _reason(stamp, status, version),
                         "write_version": stamp})
    return [r.key for r in rows if r.key in written], rejected


# --- reads -----------------------------------------------------------------------------

def read_rows(session: Session, sheet_id: int | None, *, keys: Sequence[str] | None = None,
              after: str | None = None, limit: int = 500,
              max_bytes: int = SHEET_MAX_READ_BYTES) -> tuple[list[dict[str, Any]], str | None]:
    """Rows in key order, at most `limit` and about `max_bytes`; and the cursor after them."""
    if sheet_id is None:
        return [], None
    columns = (SheetRow.key, SheetRow.status, SheetRow.write_version, SheetRow.data,
               SheetRow.result, SheetRow.error)
    found: Any
    if keys is not None:
        wanted = sorted(k for k in set(keys) if after is None or k > after)
        found = _lookup(session, sheet_id, wanted, columns)
    else:
        stmt = sa.select(*columns).where(SheetRow.sheet_id == sheet_id).order_by(SheetRow.key)
        if after is not None:
            stmt = stmt.where(SheetRow.key > after)
        found = session.execute(stmt.limit(limit + 1))
    out: list[dict[str, Any]] = []
    size = 0
    more = False
    for row in found:
        if len(out) == limit or (out and size > max_bytes):
            more = True
            break
        item = {"key": row.key, "status": row.status, "write_version": row.write_version,
                "data": row.data, "result": row.result, "error": row.error}
        size += encoded_size(item)
        out.append(item)
    return out, (out[-1]["key"] if more and out else None)
