"""`playrun providers` (what this install can use, a live check) and `playrun gc`."""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Annotated

import typer

from tasks.cli.output import console as plain_console
from tasks.constants import MAX_DURATION_S
from tasks.parse.checks import check_seconds, parse_number

providers_app = typer.Typer(help="Sandbox providers: what is installed, and a live check.",
                            no_args_is_help=True)


@providers_app.command("list")
def list_providers(as_json: bool = typer.Option(False, "--json", help="JSON lines.")) -> None:
    """Each provider: its extra, whether its SDK is installed and its credentials set."""
    from tasks.sandbox import providers
    from tasks.settings import get_settings

    configured = get_settings().sandbox_provider
    rows = [{"provider": name, "extra": "-", "installed": True, "credentials": "-",
             "configured": name == configured} for name in providers.LOCAL]
    for name, entry in providers.REMOTE.items():
        try:
            providers.check_credentials(name, dict(os.environ))
            creds = "set" if entry.credentials else "SDK's own chain"
        except providers.ProviderCredentialsMissingError:
            creds = "missing"
        rows.append({"provider": name, "extra": entry.extra,
                     "installed": importlib.util.find_spec(entry.sdk) is not None,
                     "credentials": creds, "configured": name == configured})
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    out = plain_console()
    out.print(f"{'PROVIDER':<10} {'EXTRA':<10} {'INSTALLED':<10} {'CREDENTIALS':<16} CONFIGURED")
    for row in rows:
        out.print(f"{row['provider']:<10} {row['extra']:<10} "
                  f"{'yes' if row['installed'] else 'no':<10} {row['credentials']:<16} "
                  f"{'yes' if row['configured'] else ''}")


@providers_app.command("check")
def check() -> None:
    """Create a sandbox on the configured provider, run python in it, call the gateway's
    public URL from inside, delete it; each step timed. Exit 2 when a step fails."""
    from tasks.sandbox.providers.check import run_check
    from tasks.sandbox.runtime import provider
    from tasks.settings import get_settings

    report = run_check(get_settings(), provider)
    for step in report.steps:
        mark = "ok  " if step.ok else "FAIL"
        line = f"{mark} {step.name:<32} {step.seconds:7.2f}s  {step.detail}"
        if not step.ok:
            line += f"  (error {step.code})"
        typer.echo(line)
    if not report.ok:
        raise typer.Exit(2)


def gc(grace: Annotated[str | None, typer.Option(
        "--grace", metavar="SECONDS", help="spare sandboxes younger than this")] = None) -> None:
    """Run one sandbox GC pass now and print what it did."""
    from tasks.maintenance.gc import collect
    from tasks.sandbox.runtime import provider
    from tasks.settings import get_settings

    settings = get_settings()
    grace_s = settings.gc_grace_s if grace is None else check_seconds(
        parse_number(grace, "--grace"), "--grace", allow_zero=True, maximum=MAX_DURATION_S)
    report = collect([provider()], grace_s, fleet=settings.fleet)
    print(f"listed {report.listed}, kept {report.kept}, too young {report.young}, "
          f"other fleets {report.other_fleet}, "
          f"deleted {len(report.deleted)}, failed {len(report.failed)}")
    for prov, sid, why in report.deleted:
        print(f"deleted {prov}/{sid}: {why}")
    for prov, sid, why in report.failed:
        print(f"failed {prov}/{sid}: {why}")
