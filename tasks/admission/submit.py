"""Admission: runs, their `run.admitted` events and outbox rows, committed in one transaction.

`admit_many` validates every item first: one bad item refuses the whole batch before
anything is written, and the error (the same class and code submit_run raises) names
the item's index. A key repeated inside the batch, or already used by the org, gives
back the earlier run and writes nothing for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import Outbox, db_now, new_task_id
from tasks.admission import placement, rows
from tasks.admission.validate import PlaySource, check_input, load_play
from tasks.constants import MAX_SUBMIT_BATCH, TASK_START_ATTEMPT
from tasks.errors import InputInvalidError, PlayrunError
from tasks.observe import metrics
from tasks.parse.checks import check_idempotency_key, check_org_id
from tasks.store.db import driver_cursor, get_engine

log = logging.getLogger("playrun.admission")

_ITEM_KEYS = frozenset({"play", "input", "org_id", "idempotency_key", "placement"})


@dataclass(frozen=True)
class RunRequest:
    """One run for submit_runs: submit_run's arguments, checked only when submitted."""

    play: str | Path
    org_id: str
    input: Any = None
    idempotency_key: str | None = None
    placement: str | None = None


@dataclass(frozen=True)
class Admitted:
    run_id: str
    created: bool
    outbox_id: str | None
    provider: str | None = None  # the queue its start went to, when placed
    handed_off: bool = False  # its outbox row was written marked sent, for us to publish


def enqueue_start(session: Session, run_id: str, org_id: str, *, delay_s: float = 0.0,
                  provider: str | None = None, place: datetime | None = None) -> str:
    """Add a start_attempt outbox row (published after commit, or by the sweep when due);
    a start placed on a provider goes to its queue. `place` is the run's place in its
    org's line for the fair relay: its admission time, so a deferred start comes back
    where it was (now when not given)."""
    outbox_id = new_task_id()
    session.add(Outbox(
        id=outbox_id, run_id=run_id, task_name=TASK_START_ATTEMPT,
        args=rows.start_args(run_id, provider),
        available_at=db_now(delay_s), org_id=org_id,
        place=place if place is not None else db_now(),
    ))
    return outbox_id


def _check(play: Any, input: Any, org_id: Any, idempotency_key: Any,
           plays: dict[Any, PlaySource], placement_name: Any = None) -> rows.NewRun:
    """submit_run's checks, in its order; a play path read once per batch."""
    org = check_org_id(org_id)
    key = check_idempotency_key(idempotency_key)
    value = check_input(input)
    cache_key = (type(play), play) if isinstance(play, (str, Path)) else None
    bundle = plays.get(cache_key) if cache_key is not None else None
    if bundle is None:
        bundle = load_play(play)
        if cache_key is not None:
            plays[cache_key] = bundle
    return rows.NewRun(org, key, value, bundle, placement.resolve(org, placement_name))


def _check_item(index: int, item: Any, plays: dict[Any, PlaySource]) -> rows.NewRun:
    try:
        if isinstance(item, RunRequest):
            return _check(item.play, item.input, item.org_id, item.idempotency_key, plays,
                          item.placement)
        if not isinstance(item, Mapping):
            raise InputInvalidError(f"must be a RunRequest or a dict, not {type(item).__name__}")
        unknown = [k for k in item if k not in _ITEM_KEYS]
        if unknown:
            raise InputInvalidError(f"unknown field {str(unknown[0])[:60]!r}; "
                                    f"fields are {', '.join(sorted(_ITEM_KEYS))}")
        for required in ("play", "org_id"):
            if required not in item:
                raise InputInvalidError(f"needs {required!r}")
        return _check(item["play"], item.get("input"), item["org_id"],
                      item.get("idempotency_key"), plays, item.get("placement"))
    except PlayrunError as exc:
        refused = type(exc)(f"submit_runs item {index}: {exc.message}")
        refused.item = index
        raise refused from exc


def check_items(items: Any) -> list[rows.NewRun]:
    """Every item checked before any is written (a bad one refuses the batch)."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise InputInvalidError(
            f"submit_runs takes a list of RunRequests or dicts, not {type(items).__name__}")
    if len(items) > MAX_SUBMIT_BATCH:
        raise InputInvalidError(f"submit_runs got {len(items)} items; "
                                f"the limit is {MAX_SUBMIT_BATCH} per call")
    plays: dict[Any, PlaySource] = {}
    return [_check_item(i, item, plays) for i, item in enumerate(items)]


# Bundles committed per database (by URL), as this process wrote them: a later run of
# the same play does not send its source again. Bundles are never deleted by playrun;
# should one go anyway, the runs' foreign key refuses the write and it is sent again.
_STORED_BUNDLES_MAX = 4096
_stored_bundles: dict[str, set[str]] = {}
_stored_lock = threading.Lock()


def _stored(engine: sa.Engine) -> set[str]:
    key = engine.url.render_as_string(hide_password=True)
    with _stored_lock:
        return _stored_bundles.setdefault(key, set())


def _remember(stored: set[str], items: Sequence[rows.NewRun]) -> None:
    with _stored_lock:
        if len(stored) > _STORED_BUNDLES_MAX:
            stored.clear()  # many plays: start again, each costs one resend
        stored.update(item.play.digest for item in items)


def _forget(engine: sa.Engine, items: Sequence[rows.NewRun]) -> bool:
    """Drop the batch's bundles from what is known stored; True if any was known."""
    stored = _stored(engine)
    with _stored_lock:
        known = {item.play.digest for item in items} & stored
        stored.difference_update(known)
    return bool(known)


def _same_request(a: rows.NewRun, b: rows.NewRun) -> bool:
    return a.play.digest == b.play.digest and rows.same_json(a.input, b.input)


def _write_once(items: Sequence[rows.NewRun], handed_off: bool) -> list[Admitted]:
    # A key repeated inside the batch maps to its first occurrence: written once.
    first: dict[tuple[str, str], int] = {}
    unique: list[rows.NewRun] = []
    slot: list[int] = []
    for item in items:
        if item.idempotency_key is None:
            slot.append(len(unique))
            unique.append(item)
            continue
        pair = (item.org_id, item.idempotency_key)
        if pair not in first:
            first[pair] = len(unique)
            unique.append(item)
        elif not _same_request(unique[first[pair]], item):
            raise InputInvalidError(f"the idempotency key {item.idempotency_key!r} is given "
                                    "twice in the batch with another play or input")
        slot.append(first[pair])
    engine = get_engine()
    if engine.dialect.name == "postgresql":
        # The write is one statement, so autocommit makes it one transaction and one
        # round trip (no BEGIN, no COMMIT); the lookup of earlier keys only reads.
        stored = _stored(engine)
        with driver_cursor() as cur:
            written = rows.write_pg(cur, unique, handed_off=handed_off, known=stored)
        _remember(stored, unique)
    else:
        with engine.begin() as conn:  # BEGIN IMMEDIATE (tasks.store.db): the write lock
            written = rows.write_sqlite(conn, unique, handed_off=handed_off)
    seen: set[int] = set()
    out = []
    for s in slot:
        w = written[s]
        out.append(Admitted(w.run_id, w.created and s not in seen,
                            w.outbox_id if s not in seen else None, w.provider, handed_off))
        seen.add(s)
    return out


def write_admitted(items: Sequence[rows.NewRun], *, handed_off: bool) -> list[Admitted]:
    """One transaction for the whole batch; `handed_off` marks the outbox rows as being
    published by this process right after commit (relay.publish_admitted)."""
    if not items:
        return []
    try:
        admitted = _write_once(items, handed_off)
    except sa.exc.IntegrityError:
        # A concurrent admission with one of our keys won the unique index while we wrote:
        # once it has committed, a second pass finds its run. Or a bundle taken for
        # stored is gone: the second pass sends it.
        resent = _forget(get_engine(), items)
        if not resent and all(item.idempotency_key is None for item in items):
            raise
        admitted = _write_once(items, handed_off)
    # Counted once committed, and only the runs this call created.
    metrics.runs_admitted(sum(1 for a in admitted if a.created))
    return admitted


def admit(play: str | Path, input: Any, org_id: str, idempotency_key: str | None, *,
          handed_off: bool | Callable[[str], bool] = False,
          placement: str | None = None) -> Admitted:
    """Validate one run (tasks.admission.validate), then write it in one transaction.
    `handed_off` may be asked of the valid run's org, just before the write."""
    item = _check(play, input, org_id, idempotency_key, {}, placement)
    hand_off = handed_off(item.org_id) if callable(handed_off) else handed_off
    return write_admitted([item], handed_off=hand_off)[0]


def admit_many(items: Any, *, handed_off: bool = False) -> list[Admitted]:
    return write_admitted(check_items(items), handed_off=handed_off)
