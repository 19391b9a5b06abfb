"""Run listings and run-id prefixes, shared by the API, the CLI and the dashboard.

Listings are newest first and paged on the server by a keyset cursor on
(created_at, id): a page costs an index range scan whatever the page number (no
OFFSET), and runs created at the same instant are neither skipped nor repeated.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import sqlalchemy as sa

from models import Run, UTCDateTime
from tasks.errors import RunIdAmbiguousError, RunNotFoundError
from tasks.parse.checks import check_list_limit, check_org_id
from tasks.parse.query import (
    Cursor,
    check_code,
    check_cursor,
    check_moment,
    check_run_prefix,
    check_status,
)
from tasks.store.db import ensure_schema_once, session_scope

# Candidates an ambiguous prefix names in its error.
_SHOWN_CANDIDATES = 5


class _Listed(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def created_at(self) -> datetime: ...


@dataclass(frozen=True)
class RunFilter:
    """A checked listing request (every field through tasks.parse.query)."""

    limit: int
    org_id: str | None
    status: str | None
    code: str | None
    since: datetime | None
    until: datetime | None
    before: Cursor | None

    @classmethod
    def check(cls, limit: Any = 50, org_id: Any = None, *, status: Any = None,
              code: Any = None, since: Any = None, until: Any = None,
              before: Any = None) -> RunFilter:
        return cls(check_list_limit(limit),
                   None if org_id is None else check_org_id(org_id),
                   check_status(status), check_code(code), check_moment(since, "since"),
                   check_moment(until, "until"), check_cursor(before))

    def where(self) -> list[sa.ColumnElement[bool]]:
        where: list[sa.ColumnElement[bool]] = []
        if self.org_id is not None:
            where.append(Run.org_id == self.org_id)
        if self.status is not None:
            where.append(Run.status == self.status)
        if self.code is not None:
            where.append(Run.code == self.code)
        if self.since is not None:
            where.append(Run.created_at >= self.since)
        if self.until is not None:
            where.append(Run.created_at < self.until)
        if self.before is not None:
            # A row-value comparison: PostgreSQL walks the (created_at, id) index from it.
            where.append(sa.tuple_(Run.created_at, Run.id) < sa.tuple_(
                sa.literal(self.before.created_at, UTCDateTime()),
                sa.literal(self.before.run_id, sa.String())))
        return where


def find_runs(query: RunFilter) -> list[Run]:
    """Run rows (detached) for a checked filter, newest first."""
    ensure_schema_once()
    stmt = (sa.select(Run).where(*query.where())
            .order_by(Run.created_at.desc(), Run.id.desc()).limit(query.limit))
    with session_scope(readonly=True) as session:
        return list(session.scalars(stmt))


def run_cursor(run: _Listed) -> str:
    """The cursor to pass as `before` for the page after the one that ended with `run`."""
    return Cursor(run.created_at, run.id).text()


def resolve_run_id(prefix: Any) -> str:
    """The full id of the one run whose id starts with `prefix` (at least 6 hex digits).

    RUN_NOT_FOUND when none does, RUN_ID_AMBIGUOUS (an INPUT_INVALID) naming the
    candidates when several do.
    """
    prefix = check_run_prefix(prefix)
    ensure_schema_once()
    # Ids are lower-case hex, so [prefix, prefix + "g") is exactly the ids it starts;
    # the range lets the primary key index answer, LIKE alone would not on PostgreSQL.
    stmt = (sa.select(Run.id).where(Run.id >= prefix, Run.id < prefix + "g")
            .order_by(Run.id).limit(_SHOWN_CANDIDATES + 1))
    with session_scope(readonly=True) as session:
        found = list(session.scalars(stmt))
    if not found:
        raise RunNotFoundError(f"no run with id {prefix!r}"
                               + (" or an id starting with it" if len(prefix) < 32 else ""))
    if len(found) > 1:
        shown = ", ".join(found[:_SHOWN_CANDIDATES])
        more = " and more" if len(found) > _SHOWN_CANDIDATES else ""
        raise RunIdAmbiguousError(f"run id prefix {prefix!r} names several runs: "
                                  f"{shown}{more}; give more characters")
    return found[0]
