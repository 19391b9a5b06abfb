"""The rows of an admission: bundles, runs, `run.admitted` events and outbox rows, many at once.

On PostgreSQL one statement writes everything: arrays go in as parameters, `unnest`
turns them into rows, and data-modifying CTEs insert bundles, runs, events and outbox
rows (the statement text does not grow with the batch, so its plan is reused). On
SQLite, which has no data-modifying CTEs, four multi-row INSERTs do the same in the
caller's BEGIN IMMEDIATE transaction. On PostgreSQL the caller may run the write in
autocommit: a single statement is a transaction of its own. A key already used by the
org inserts nothing (ON CONFLICT DO NOTHING); its earlier run is looked up afterwards,
and if that run had another play or input the key is an IDEMPOTENCY_CONFLICT. A batch
with such a key writes none of its runs (the statement checks before it inserts).

One run (submit_run) has its own statement of plain values: no arrays to adapt and
unnest, a third less work for PostgreSQL than the batch statement. On PostgreSQL a
bundle the caller knows is stored (`known`) is not sent again; if it is gone after
all, the runs' foreign key refuses the statement and the caller writes it again with
the bundle (submit.write_admitted).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from models import Outbox, PlayBundle, Run, RunEvent, db_now, new_id, new_task_id
from tasks.admission.placement import Policy, first_provider
from tasks.admission.validate import PlaySource
from tasks.constants import TASK_START_ATTEMPT, EventKind, RunStatus
from tasks.errors import IdempotencyConflictError


@dataclass(frozen=True)
class NewRun:
    """One validated run to admit (its org's key unique within the batch)."""

    org_id: str
    idempotency_key: str | None
    input: Any
    play: PlaySource
    policy: Policy | None = None  # placement (tasks/admission/placement.py)


@dataclass(frozen=True)
class Written:
    run_id: str
    created: bool
    outbox_id: str | None
    provider: str | None = None  # where its first start is placed


def start_args(run_id: str, provider: str | None) -> list[str]:
    """A start message's arguments: a placed start names its provider (its queue)."""
    return [run_id] if provider is None else [run_id, provider]


def _event_data(item: NewRun) -> dict[str, Any]:
    return {"play_digest": item.play.digest, "idempotency_key": item.idempotency_key,
            "play_path": item.play.path}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def same_json(a: Any, b: Any) -> bool:
    """JSON equality as PostgreSQL's jsonb has it: numbers by value, booleans apart."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def conflict(run_id: str, key: str | None) -> IdempotencyConflictError:
    return IdempotencyConflictError(
        f"the idempotency key {key!r} names run {run_id}, submitted with another play or "
        "input", run_id=run_id)


# The statement sets sent_at at insert when the admitting process publishes right after
# commit (handed_off): no second transaction to mark it. If that process dies before it
# publishes, the sweep's resend of long-queued runs picks the row up (relay.resend_stale).
_PG_WRITE = f"""
WITH items AS (
    SELECT * FROM unnest(%(id)s::varchar[], %(org)s::varchar[], %(path)s::varchar[],
                         %(digest)s::varchar[], %(key)s::varchar[], %(input)s::jsonb[],
                         %(event)s::jsonb[], %(outbox)s::varchar[], %(placement)s::varchar[],
                         %(provider)s::varchar[])
        AS t(id, org_id, play_path, play_digest, idempotency_key, input, event, outbox_id,
             placement, provider)
), bundles AS (
    INSERT INTO play_bundles (digest, source, size)
    SELECT * FROM unnest(%(b_digest)s::varchar[], %(b_source)s::text[], %(b_size)s::int[])
    ON CONFLICT (digest) DO NOTHING
), conflicted AS (
    SELECT 1 FROM items JOIN runs r
      ON r.org_id = items.org_id AND r.idempotency_key = items.idempotency_key
    WHERE r.input IS DISTINCT FROM items.input OR r.play_digest <> items.play_digest
    LIMIT 1
), inserted AS (
    INSERT INTO runs (id, org_id, play_path, play_digest, idempotency_key, input, status,
                      current_generation, deferral_count, deferral_total_ms, placement)
    SELECT id, org_id, play_path, play_digest, idempotency_key, input, '{RunStatus.QUEUED}',
           0, 0, 0, placement
    FROM items WHERE NOT EXISTS (SELECT 1 FROM conflicted)
    ON CONFLICT (org_id, idempotency_key) DO NOTHING
    RETURNING id
), events AS (
    INSERT INTO run_events (run_id, kind, data)
    SELECT items.id, '{EventKind.ADMITTED}', items.event FROM items JOIN inserted USING (id)
), outbox_rows AS (
    INSERT INTO outbox (id, run_id, task_name, args, sent_at, publish_count, org_id, place)
    SELECT items.outbox_id, items.id, '{TASK_START_ATTEMPT}',
           CASE WHEN items.provider IS NULL THEN jsonb_build_array(items.id)
                ELSE jsonb_build_array(items.id, items.provider) END,
           CASE WHEN %(handed_off)s THEN clock_timestamp() END,
           CASE WHEN %(handed_off)s THEN 1 ELSE 0 END, items.org_id, clock_timestamp()
    FROM items JOIN inserted USING (id)
)
SELECT id FROM inserted
"""

_PG_BUNDLE = """
), bundles AS (
    INSERT INTO play_bundles (digest, source, size)
    VALUES (%(b_digest)s, %(b_source)s, %(b_size)s)
    ON CONFLICT (digest) DO NOTHING"""

# One run: the batch statement's shape with values for arrays; {bundle} is _PG_BUNDLE
# or nothing. RI checks run at the end of the statement, so they see the bundle.
_PG_WRITE_ONE = f"""
WITH inserted AS (
    INSERT INTO runs (id, org_id, play_path, play_digest, idempotency_key, input, status,
                      current_generation, deferral_count, deferral_total_ms, placement)
    VALUES (%(id)s, %(org)s, %(path)s, %(digest)s, %(key)s, %(input)s::jsonb, '{RunStatus.QUEUED}',
            0, 0, 0, %(placement)s)
    ON CONFLICT (org_id, idempotency_key) DO NOTHING
    RETURNING id{{bundle}}
), events AS (
    INSERT INTO run_events (run_id, kind, data)
    SELECT id, '{EventKind.ADMITTED}', %(event)s::jsonb FROM inserted
), outbox_rows AS (
    INSERT INTO outbox (id, run_id, task_name, args, sent_at, publish_count, org_id, place)
    SELECT %(outbox)s, id, '{TASK_START_ATTEMPT}', %(args)s::jsonb,
           CASE WHEN %(handed_off)s THEN clock_timestamp() END,
           CASE WHEN %(handed_off)s THEN 1 ELSE 0 END, %(org)s, clock_timestamp()
    FROM inserted
)
SELECT id FROM inserted
"""
_PG_ONE = {True: _PG_WRITE_ONE.format(bundle=_PG_BUNDLE), False: _PG_WRITE_ONE.format(bundle="")}

_PG_EXISTING = """
SELECT r.org_id, r.idempotency_key, r.id,
       r.input IS NOT DISTINCT FROM k.input AND r.play_digest = k.digest
FROM runs r
JOIN unnest(%(org)s::varchar[], %(key)s::varchar[], %(input)s::jsonb[], %(digest)s::varchar[])
  AS k(org_id, idempotency_key, input, digest)
  ON r.org_id = k.org_id AND r.idempotency_key = k.idempotency_key
"""


def _bundles(items: Sequence[NewRun]) -> dict[str, PlaySource]:
    return {item.play.digest: item.play for item in items}


def _write_pg(cur: psycopg.Cursor[Any], items: Sequence[NewRun], ids: list[str],
              outbox_ids: list[str], placed: list[str | None], handed_off: bool,
              known: AbstractSet[str]) -> set[str]:
    bundles = [b for b in _bundles(items).values() if b.digest not in known]
    if len(items) == 1:
        item = items[0]
        params: dict[str, Any] = {
            "id": ids[0], "org": item.org_id, "path": item.play.path,
            "digest": item.play.digest, "key": item.idempotency_key,
            "input": _dumps(item.input), "event": _dumps(_event_data(item)),
            "outbox": outbox_ids[0], "handed_off": handed_off,
            "placement": item.policy.name if item.policy else None,
            "args": _dumps(start_args(ids[0], placed[0])),
        }
        if bundles:
            params.update(b_digest=item.play.digest, b_source=item.play.source,
                          b_size=len(item.play.source.encode()))
        cur.execute(_PG_ONE[bool(bundles)], params)
        return {row[0] for row in cur.fetchall()}
    params = {
        "id": ids, "org": [i.org_id for i in items], "path": [i.play.path for i in items],
        "digest": [i.play.digest for i in items],
        "key": [i.idempotency_key for i in items],
        "input": [_dumps(i.input) for i in items],
        "event": [_dumps(_event_data(i)) for i in items], "outbox": outbox_ids,
        "placement": [i.policy.name if i.policy else None for i in items], "provider": placed,
        "b_digest": [b.digest for b in bundles], "b_source": [b.source for b in bundles],
        "b_size": [len(b.source.encode()) for b in bundles], "handed_off": handed_off,
    }
    cur.execute(_PG_WRITE, params)
    return {row[0] for row in cur.fetchall()}


# Rows per multi-row INSERT: 10 columns each stays far below SQLite's 32766 variables.
_SQLITE_CHUNK = 500


def _write_sqlite(conn: sa.Connection, items: Sequence[NewRun], ids: list[str],
                  outbox_ids: list[str], placed: list[str | None],
                  handed_off: bool) -> set[str]:
    # Every bundle: a local INSERT in the same transaction, nothing to save.
    conn.execute(sqlite_insert(PlayBundle).on_conflict_do_nothing(index_elements=["digest"]),
                    [{"digest": b.digest, "source": b.source, "size": len(b.source.encode())}
                     for b in _bundles(items).values()])
    inserted: set[str] = set()
    rows = [{"id": run_id, "org_id": item.org_id, "play_path": item.play.path,
             "play_digest": item.play.digest, "idempotency_key": item.idempotency_key,
             "input": item.input, "status": RunStatus.QUEUED, "current_generation": 0,
             "deferral_count": 0, "deferral_total_ms": 0,
             "placement": item.policy.name if item.policy else None}
            for item, run_id in zip(items, ids, strict=True)]
    for start in range(0, len(rows), _SQLITE_CHUNK):
        # RETURNING names only the rows ON CONFLICT let through.
        inserted.update(conn.scalars(
            sqlite_insert(Run).values(rows[start:start + _SQLITE_CHUNK])
            .on_conflict_do_nothing(index_elements=["org_id", "idempotency_key"])
            .returning(Run.id)))
    new = [(item, run_id, outbox_id, provider)
           for item, run_id, outbox_id, provider in zip(items, ids, outbox_ids, placed,
                                                        strict=True)
           if run_id in inserted]
    if new:
        conn.execute(sa.insert(RunEvent), [
            {"run_id": run_id, "kind": EventKind.ADMITTED, "data": _event_data(item)}
            for item, run_id, _, _ in new])
        conn.execute(sa.insert(Outbox).values(sent_at=db_now() if handed_off else None,
                                              place=db_now()), [
            {"id": outbox_id, "run_id": run_id, "task_name": TASK_START_ATTEMPT,
             "args": start_args(run_id, provider), "publish_count": 1 if handed_off else 0,
             "org_id": item.org_id}
            for item, run_id, outbox_id, provider in new])
    return inserted


def _existing_pg(cur: psycopg.Cursor[Any],
                 items: list[NewRun]) -> dict[tuple[str, str], tuple[str, bool]]:
    if not items:
        return {}
    cur.execute(_PG_EXISTING, {"org": [i.org_id for i in items],
                               "key": [i.idempotency_key for i in items],
                               "input": [_dumps(i.input) for i in items],
                               "digest": [i.play.digest for i in items]})
    return {(org, key): (run_id, same) for org, key, run_id, same in cur.fetchall()}


def _existing_sqlite(conn: sa.Connection,
                     items: list[NewRun]) -> dict[tuple[str, str], tuple[str, bool]]:
    if not items:
        return {}
    wanted = {(i.org_id, i.idempotency_key or ""): i for i in items}
    rows = conn.execute(sa.select(Run.org_id, Run.idempotency_key, Run.id, Run.input,
                                  Run.play_digest).where(
        sa.tuple_(Run.org_id, Run.idempotency_key).in_(list(wanted))))
    found = {}
    for org, key, run_id, stored, digest in rows:
        item = wanted[(org, str(key))]
        found[(org, str(key))] = (run_id, digest == item.play.digest
                                  and same_json(stored, item.input))
    return found


# (ordered items, run ids, outbox ids, placed providers) -> the run ids inserted; items
# with a key -> (org, key) -> (their earlier run, whether it had the same play and input).
_Insert = Callable[[list[NewRun], list[str], list[str], list[str | None]], set[str]]
_Existing = Callable[[list[NewRun]], dict[tuple[str, str], tuple[str, bool]]]


def write_pg(cur: psycopg.Cursor[Any], items: Sequence[NewRun], *, handed_off: bool,
             known: AbstractSet[str] = frozenset()) -> list[Written]:
    """`write` on PostgreSQL, on a cursor in autocommit (tasks.store.db.driver_cursor): one
    statement, one transaction. `known`: digests of bundles committed in this database
    already (not sent again)."""
    return _write(items, lambda o, i, b, p: _write_pg(cur, o, i, b, p, handed_off, known),
                  lambda pairs: _existing_pg(cur, pairs))


def write_sqlite(conn: sa.Connection, items: Sequence[NewRun], *,
                 handed_off: bool) -> list[Written]:
    """`write` on SQLite, in the caller's BEGIN IMMEDIATE transaction."""
    return _write(items, lambda o, i, b, p: _write_sqlite(conn, o, i, b, p, handed_off),
                  lambda pairs: _existing_sqlite(conn, pairs))


def _write(items: Sequence[NewRun], insert: _Insert, existing: _Existing) -> list[Written]:
    """Insert every run whose key is new; the others come back as created=False.

    Items are written in (org, key) order so two batches that share keys take the
    unique-index locks in one order and never deadlock.
    """
    order = sorted(range(len(items)), key=lambda i: (items[i].org_id,
                                                     items[i].idempotency_key or ""))
    ordered = [items[i] for i in order]
    ids = [new_id() for _ in ordered]
    outbox_ids = [new_task_id() for _ in ordered]
    placed = [first_provider(item.policy, run_id) if item.policy else None
              for item, run_id in zip(ordered, ids, strict=True)]
    inserted = insert(ordered, ids, outbox_ids, placed)
    missing = [(pos, item) for pos, item, run_id in zip(order, ordered, ids, strict=True)
               if run_id not in inserted and item.idempotency_key is not None]
    earlier = existing([item for _, item in missing])
    for pos, item in missing:  # the batch's first conflict in (org, key) order refuses it
        run_id, same = earlier.get((item.org_id, item.idempotency_key or ""), ("", True))
        if not same:
            exc = conflict(run_id, item.idempotency_key)
            exc.item = pos
            raise exc
    out: list[Written | None] = [None] * len(items)
    for pos, item, run_id, outbox_id, provider in zip(order, ordered, ids, outbox_ids, placed,
                                                      strict=True):
        if run_id in inserted:
            out[pos] = Written(run_id, True, outbox_id, provider)
            continue
        found, _same = earlier.get((item.org_id, item.idempotency_key or ""), (None, True))
        if found is None:
            # Only a concurrent batch still in flight can cause this: the caller retries.
            raise sa.exc.IntegrityError("admission", None, Exception(
                f"run with key {item.idempotency_key!r} is being admitted concurrently"))
        out[pos] = Written(found, False, None)
    return [w for w in out if w is not None]
