"""`playrun runs`: the run listing of the CLI, filtered like the dashboard's.

Run ids are never cut, whatever the terminal's width: the id column keeps its 32
characters and the other columns wrap or shorten instead, so an id can always be
copied into `playrun show`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

import tasks
from tasks.parse.checks import parse_count
from tasks.parse.query import parse_moment


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


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
    return f"{seconds:.1f}s" if seconds < 100 else f"{seconds / 60:.0f}m"


def table(views: Sequence[tasks.RunView]) -> Table:
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("id", min_width=32, no_wrap=True, overflow="ignore")
    t.add_column("org", overflow="fold")
    t.add_column("status", overflow="fold")
    t.add_column("code", overflow="fold")
    t.add_column("created (UTC)", overflow="fold")
    t.add_column("took", no_wrap=True, overflow="ellipsis")
    for v in views:
        t.add_row(v.id, v.org_id, v.status, v.code or "", f"{v.created_at:%Y-%m-%d %H:%M:%S}",
                  _took(v))
    return t


def print_runs(console: Console, views: Sequence[tasks.RunView], next_before: str | None,
               as_json: bool) -> None:
    if as_json:
        print(json.dumps({"runs": [run_dict(v) for v in views], "next": next_before},
                         indent=2))
        return
    console.print(table(views))
    if next_before:
        console.print(f"more: --before {next_before}", soft_wrap=True)
