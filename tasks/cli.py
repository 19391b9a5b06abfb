"""The `playrun` command line (SPEC section 5)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tasks.errors import PlayrunError

app = typer.Typer(help="playrun: run plays in isolated sandboxes.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
db_app = typer.Typer(help="Database schema (Alembic).", no_args_is_help=True)
policy_app = typer.Typer(help="Traffic policy for sandbox starts.", no_args_is_help=True)
capacity_app = typer.Typer(help="Per-org sandbox capacity.", no_args_is_help=True)
sheet_app = typer.Typer(help="Runtime sheets: rows plays fill, by (org, play, table).",
                        no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(policy_app, name="policy")
app.add_typer(capacity_app, name="capacity")
app.add_typer(sheet_app, name="sheet")
console = Console()


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _view_dict(view: Any) -> dict[str, Any]:
    return {
        "id": view.id, "org_id": view.org_id, "status": view.status, "code": view.code,
        "error": view.error, "output": view.output, "created_at": view.created_at.isoformat(),
        "finished_at": view.finished_at.isoformat() if view.finished_at else None,
        "attempts": [{"generation": a.generation, "state": a.state, "sandbox_id": a.sandbox_id,
                      "started_at": a.started_at.isoformat(),
                      "ended_at": a.ended_at.isoformat() if a.ended_at else None,
                      "last_heartbeat_at": _iso(a.last_heartbeat_at),
                      "heartbeat_deadline": _iso(a.heartbeat_deadline)}
                     for a in view.attempts],
    }


@app.command()
def demo(keep: bool = typer.Option(False, help="Keep the demo's logs and database.")) -> None:
    """Run the sample play on the embedded stack (private Redis, SQLite, worker, beat)."""
    from tasks.demo import run_demo

    raise typer.Exit(run_demo(keep=keep))


@app.command()
def gateway() -> None:
    """Serve the runtime API for sandboxes (TCP from PLAYRUN_GATEWAY_URL, and a Unix socket)."""
    from tasks.gateway.serve import serve
    from tasks.settings import get_settings

    serve(get_settings())


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Migrate the database to the newest schema (the only command that runs DDL)."""
    from tasks import db

    db.upgrade(revision=revision)
    console.print(f"database at revision {db.current_revision()}")


@db_app.command("current")
def db_current() -> None:
    from tasks import db

    console.print(f"current {db.current_revision()} head {db.head_revision()}")


@app.command()
def submit(play: Path, input: Annotated[str, typer.Option("--input")] = "null",
           org: Annotated[str, typer.Option("--org")] = "default",
           key: Annotated[str | None, typer.Option("--key", help="idempotency key")] = None,
           wait: bool = False, timeout: float = 300.0) -> None:
    """Submit a run; with --wait, print its result."""
    import tasks
    from tasks.admission.validate import parse_input_text

    handle = tasks.submit_run(play, parse_input_text(input), org_id=org, idempotency_key=key)
    if not wait:
        print(handle.id)
        return
    result = handle.wait(timeout=timeout)
    print(json.dumps({"id": handle.id, "status": result.status, "output": result.output,
                      "code": result.code, "error": result.error}, indent=2))
    raise typer.Exit(0 if result.status == "succeeded" else 1)


@app.command()
def runs(limit: int = 20, org: str | None = None) -> None:
    """List recent runs."""
    import tasks

    table = Table("id", "org", "status", "code", "created", "finished")
    for v in tasks.list_runs(limit=limit, org_id=org):
        table.add_row(v.id, v.org_id, v.status, v.code or "", f"{v.created_at:%Y-%m-%d %H:%M:%S}",
                      f"{v.finished_at:%H:%M:%S}" if v.finished_at else "")
    console.print(table)


@app.command()
def show(run_id: str, events: bool = True) -> None:
    """Show one run, its attempts and (by default) its ledger."""
    import tasks

    print(json.dumps(_view_dict(tasks.get_run(run_id)), indent=2, default=str))
    if events:
        for e in tasks.run_events(run_id):
            print(f"{e.at.isoformat()} {e.kind} {json.dumps(e.data, default=str)}")


@app.command()
def cancel(run_id: str) -> None:
    """Cancel a run (a no-op once a terminal outcome has won)."""
    import tasks

    print(json.dumps(_view_dict(tasks.cancel_run(run_id)), indent=2, default=str))


@policy_app.command("show")
def policy_show() -> None:
    from tasks.acquisition import policy

    p = policy.read()
    print(json.dumps({"mode": p.mode, "sandbox_starts_per_minute": p.starts_per_minute,
                      "expires_at": p.expires_at.isoformat() if p.expires_at else None}))


@policy_app.command("hold")
def policy_hold(for_: Annotated[str, typer.Option("--for")] = "10m",
                reason: str | None = None) -> None:
    """Hold new sandbox starts for a while (runs are deferred, not failed)."""
    from tasks.acquisition import policy
    from tasks.durations import parse_duration

    policy.set_policy(policy.HOLD, for_s=parse_duration(for_), reason=reason)
    policy_show()


@policy_app.command("throttle")
def policy_throttle(per_minute: float, for_: Annotated[str, typer.Option("--for")] = "1h",
                    reason: str | None = None) -> None:
    """Override the adaptive start rate with PER_MINUTE starts a minute for a while."""
    from tasks.acquisition import policy
    from tasks.durations import parse_duration

    policy.set_policy(policy.THROTTLE, for_s=parse_duration(for_), starts_per_minute=per_minute,
                      reason=reason)
    policy_show()


@policy_app.command("normal")
def policy_normal() -> None:
    from tasks.acquisition import policy

    policy.set_policy(policy.NORMAL, for_s=None)
    policy_show()


@capacity_app.command("show")
def capacity_show() -> None:
    from tasks.acquisition import capacity
    from tasks.settings import get_settings

    settings = get_settings()
    table = Table("org", "limit", "reserved", "live")
    for org, limit, reserved, live in capacity.show(settings.org_capacity):
        table.add_row(org, str(limit), str(reserved), str(live))
    console.print(f"default limit {settings.org_capacity} per org, mode {settings.capacity_mode}")
    console.print(table)


@capacity_app.command("set")
def capacity_set(org: str, limit: Annotated[int, typer.Argument(min=0)]) -> None:
    """Set ORG's concurrent-sandbox limit (0 stops its starts)."""
    from tasks.acquisition import capacity

    capacity.set_limit(org, limit)
    capacity_show()


@capacity_app.command("unset")
def capacity_unset(org: str) -> None:
    """Remove ORG's override: it gets PLAYRUN_ORG_CAPACITY again."""
    from tasks.acquisition import capacity

    capacity.set_limit(org, None)
    capacity_show()


@app.command()
def stats(since: Annotated[str, typer.Option("--since")] = "1h") -> None:
    """Runs by status, and terminals, deferrals, overruns and starts in the window."""
    from tasks.durations import parse_duration
    from tasks.stats import as_dict, collect

    print(json.dumps(as_dict(collect(parse_duration(since))), indent=2, sort_keys=True))


@app.command()
def gc(grace: float | None = None) -> None:
    """Run one sandbox GC pass now and print what it did."""
    from tasks.maintenance.gc import collect
    from tasks.runtime import provider
    from tasks.settings import get_settings

    report = collect([provider()], get_settings().gc_grace_s if grace is None else grace)
    print(f"listed {report.listed}, kept {report.kept}, too young {report.young}, "
          f"deleted {len(report.deleted)}, failed {len(report.failed)}")
    for prov, sid, why in report.deleted:
        print(f"deleted {prov}/{sid}: {why}")
    for prov, sid, why in report.failed:
        print(f"failed {prov}/{sid}: {why}")


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
        Console(stderr=True).print(f"no sheet {table!r} for org {org!r} and play {play!r}")
        raise typer.Exit(2)
    console.print(f"sheet [bold]{found.table}[/bold] of play {found.play}, org {found.org_id}: "
                  f"{found.total} rows")
    counts = Table("status", "rows")
    for status, count in found.by_status.items():
        counts.add_row(status, str(count))
    console.print(counts)
    versions = Table("write version", "run", "kind", "rows owned")
    for v in found.versions:
        versions.add_row(str(v.version), v.run_id, v.kind, str(v.rows))
    console.print(versions)
    if rows:
        listing = Table("key", "status", "version", "result / error")
        for row in islice(iter_sheet_rows(org, play, table), rows):
            shown = row.error if row.status == "failed" else json.dumps(row.result)
            listing.add_row(row.key, row.status, str(row.write_version), (shown or "")[:80])
        console.print(listing)


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


def main() -> None:
    try:
        app()
    except PlayrunError as exc:
        Console(stderr=True).print(f"[red]error[/red] {exc.code}: {exc.message}")
        sys.exit(2)


if __name__ == "__main__":
    main()
