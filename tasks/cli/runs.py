"""`playrun runs`: the run listing of the CLI, filtered like the dashboard's.

On a terminal the table fits its width: ids are their first 12 characters (`show` and
`cancel` take a unique prefix) and times are relative; piped, every id and time is whole.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.console import Console

import tasks
from tasks.cli.output import utc_iso
from tasks.cli.tables import Column, Table, ago, short_id, show
from tasks.parse.checks import parse_count
from tasks.parse.query import parse_moment


def _iso(value: datetime | None) -> str | None:
    return utc_iso(value) if value is not None else None


def run_dict(view: Any) -> dict[str, Any]:
    return {"id": view.id, "org_id": view.org_id, "status": view.status, "code": view.code,
            "error": view.error, "play_path": view.play_path,
            "idempotency_key": view.idempotency_key, "created_at": _iso(view.created_at),
            "finished_at": _iso(view.finished_at)}


def list_for_cli(limit: str, org: str | None, status: str | None, code: str | None,
                 since: str | None, until: str | None, before: str | None
                 ) -> tuple[list[tasks.RunView], str | None]:
    """The page of runs, and the cursor of the next page (None after a short page)."""
    n = parse_count(limit, "--limit")
    found = tasks.list_runs(n, org, status=status, code=code,
                            since=parse_moment(since, "--since"),
                            until=parse_moment(until, "--until"), before=before)
    return found, (tasks.run_cursor(found[-1]) if found and len(found) == n else None)


def _took(view: Any) -> str:
    if view.finished_at is None:
        return ""
    seconds = (view.finished_at - view.created_at).total_seconds()
    if seconds < 100:
        return f"{seconds:.1f}s"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= 2 * size or unit == "m":
            return f"{seconds / size:.0f}{unit}"
    return ""


COLUMNS = (Column("id"), Column("status"), Column("code", drop=1),
           Column("org", drop=2, flex=True), Column("created"), Column("took", drop=3))


def table(views: Sequence[tasks.RunView]) -> Table:
    return Table(COLUMNS,
                 [(short_id(v.id), v.status, v.code or "", v.org_id, ago(v.created_at), _took(v))
                  for v in views],
                 [(v.id, v.status, v.code or "", v.org_id, utc_iso(v.created_at), _took(v))
                  for v in views])


def print_runs(console: Console, views: Sequence[tasks.RunView], next_before: str | None,
               as_json: bool) -> None:
    if as_json:
        print(json.dumps({"runs": [run_dict(v) for v in views], "next": next_before},
                         indent=2))
        return
    show(console, table(views))
    if next_before:  # on stderr when piped: the rows on stdout stay rows
        target = console if console.is_terminal else Console(stderr=True)
        target.print(f"more: --before {next_before}", soft_wrap=True, markup=False)
