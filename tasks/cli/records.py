"""`playrun receipts` and `playrun sheet`: what plays recorded, as tables or exports."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from tasks.cli.output import console, utc_iso
from tasks.cli.tables import Column, Table, ago, short_id, show
from tasks.constants import ReceiptState, SheetRowStatus
from tasks.errors import SheetNotFoundError

receipts_app = typer.Typer(help="Work receipts of ctx.step.", no_args_is_help=True)
sheet_app = typer.Typer(help="Runtime sheets: rows plays fill, by (org, play, table).",
                        no_args_is_help=True)

RECEIPT_COLUMNS = (Column("play", drop=4, flex=True), Column("key", flex=True), Column("status"),
                   Column("run"), Column("created", drop=3), Column("completed", drop=1),
                   Column("expires", drop=2), Column("output", flex=True))


def _output(r: Any) -> str:
    if r.status == ReceiptState.COMPLETED:
        return json.dumps(r.output, default=str)
    return f"{r.code}: {r.error}" if r.code else ""


def receipt_table(found: Sequence[Any], one_play: bool) -> Table:
    columns = RECEIPT_COLUMNS[1:] if one_play else RECEIPT_COLUMNS
    start = 1 if one_play else 0
    shown = [(r.play, r.key, r.status, f"{short_id(r.run_id)}/{r.generation}",
              ago(r.created_at), ago(r.completed_at),
              ago(r.expires_at) if r.expires_at else "never", _output(r))[start:]
             for r in found]
    plain = [(r.play, r.key, r.status, f"{r.run_id}/{r.generation}", utc_iso(r.created_at),
              utc_iso(r.completed_at) if r.completed_at else "",
              utc_iso(r.expires_at) if r.expires_at else "never", _output(r))[start:]
             for r in found]
    return Table(columns, shown, plain)


def receipt_dict(r: Any) -> dict[str, Any]:
    return {"play": r.play, "key": r.key, "org_id": r.org_id, "status": r.status,
            "run_id": r.run_id, "generation": r.generation, "output": r.output,
            "code": r.code, "error": r.error, "created_at": utc_iso(r.created_at),
            "completed_at": utc_iso(r.completed_at) if r.completed_at else None,
            "expires_at": utc_iso(r.expires_at) if r.expires_at else None}


@receipts_app.command("show")
def receipts_show(org: Annotated[str, typer.Option("--org", help="the org whose receipts")],
                  play: Annotated[str | None, typer.Option("--play", help="one play only")]
                  = None,
                  limit: Annotated[int, typer.Option(help="at most this many")] = 200,
                  as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")]
                  = False) -> None:
    """Show ORG's work receipts (of one play): status, owner run, output."""
    import tasks

    found = tasks.receipts(org, play, limit=limit)
    if as_json:
        print(json.dumps({"receipts": [receipt_dict(r) for r in found],
                          "limit_reached": len(found) == limit}, indent=2, default=str))
        return
    out = console()
    show(out, receipt_table(found, one_play=play is not None))
    # The count on stderr when piped: stdout stays header and rows.
    (out if out.is_terminal else console(stderr=True)).print(
        f"{len(found)} receipt(s)" + (" (limit reached)" if len(found) == limit else ""))


@receipts_app.command("clear")
def receipts_clear(org: Annotated[str, typer.Option("--org", help="the org whose receipts")],
                   play: Annotated[str | None, typer.Option("--play", help="one play only")]
                   = None,
                   key: Annotated[str | None, typer.Option("--key", help="one step key only")]
                   = None) -> None:
    """Delete ORG's receipts (of one play, of one step key): those steps run again."""
    import tasks

    console().print(f"cleared {tasks.clear_receipts(org, play, key)} receipt(s)")


@sheet_app.command("show")
def sheet_show(table: str, org: Annotated[str, typer.Option("--org")],
               play: Annotated[str, typer.Option("--play", help="play name or path")],
               rows: Annotated[int, typer.Option("--rows", min=0,
                                                 help="first rows to list")] = 10) -> None:
    """Counts by status and by write version, and the first rows, of one sheet."""
    from itertools import islice

    from tasks.sheets.view import iter_sheet_rows, summary

    found = summary(org, play, table)
    if found is None:
        raise SheetNotFoundError(f"no sheet {table!r} for org {org!r} and play {play!r}")
    out = console()
    out.print(f"sheet {found.table} of play {found.play}, org {found.org_id}: "
              f"{found.total} rows", markup=False)
    show(out, Table((Column("status"), Column("rows")),
                    [(str(status), str(count)) for status, count in found.by_status.items()]))
    out.print()
    show(out, Table((Column("write version"), Column("run"), Column("kind"),
                     Column("rows owned")),
                    [(str(v.version), short_id(v.run_id), v.kind, str(v.rows))
                     for v in found.versions],
                    [(str(v.version), v.run_id, v.kind, str(v.rows)) for v in found.versions]))
    if rows:
        listed = []
        for row in islice(iter_sheet_rows(org, play, table), rows):
            shown = row.error if row.status == SheetRowStatus.FAILED else json.dumps(row.result)
            listed.append((row.key, row.status, str(row.write_version), shown or ""))
        out.print()
        show(out, Table((Column("key", flex=True), Column("status"), Column("version"),
                         Column("result / error", flex=True)), listed))


@sheet_app.command("export")
def sheet_export(table: str, org: Annotated[str, typer.Option("--org")],
                 play: Annotated[str, typer.Option("--play", help="play name or path")],
                 fmt: Annotated[str, typer.Option("--format", help="csv or jsonl")] = "csv",
                 ) -> None:
    """Every row of one sheet, in key order, to stdout."""
    from tasks.sheets.view import export_lines

    if fmt not in ("csv", "jsonl"):
        raise typer.BadParameter("--format is csv or jsonl")
    for line in export_lines(org, play, table, fmt):
        sys.stdout.write(line)
