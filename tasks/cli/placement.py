"""`playrun placement`: which sandbox provider serves whose runs."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from tasks.cli.output import console as plain_console

placement_app = typer.Typer(help="Placement policies: which provider serves a run, canaries "
                                 "and fallbacks.", no_args_is_help=True)


@placement_app.command("set")
def set_policy(
    name: Annotated[str, typer.Argument(help="Policy name (a-z, 0-9, '-', '_').")],
    provider: Annotated[str, typer.Option("--provider", help="The primary provider.")],
    template: Annotated[str | None, typer.Option("--template", help="Sandbox template.")] = None,
    canary: Annotated[str | None, typer.Option(
        "--canary", help="PROVIDER:PERCENT of runs (by a hash of the run id).")] = None,
    fallback: Annotated[str | None, typer.Option(
        "--fallback", help="Providers tried in turn when the one before refuses: P,P.")] = None,
    unchecked: Annotated[bool, typer.Option(
        "--unchecked", help="Do not require a running worker for each provider.")] = False,
) -> None:
    """Create or replace a policy; refused when no worker serves a provider it names."""
    from tasks.admission import placement

    policy = placement.build(name, provider, template=template, canary=canary,
                             fallback=fallback)
    placement.set_policy(policy, check_served=not unchecked)
    typer.echo(json.dumps(policy.as_dict()))


@placement_app.command("default")
def set_default(
    org: Annotated[str, typer.Argument(help="The org whose runs take it by default.")],
    name: Annotated[str, typer.Argument(help="An existing policy.")],
) -> None:
    """The policy an org's runs take when they name none."""
    from tasks.admission import placement

    placement.set_default(org, name)
    typer.echo(json.dumps({"org_id": org, "placement": name}))


@placement_app.command("show")
def show(as_json: bool = typer.Option(False, "--json", help="One JSON document.")) -> None:
    """Every policy, each org's default and the fleet's."""
    from tasks.admission import placement

    shown = placement.show()
    if as_json:
        typer.echo(json.dumps(shown))
        return
    out = plain_console()
    out.print(f"{'POLICY':<20} {'PROVIDER':<10} {'CANARY':<14} {'FALLBACK':<24} TEMPLATE")
    for p in shown["policies"]:
        out.print(f"{p['name']:<20} {p['provider']:<10} {p['canary'] or '-':<14} "
                  f"{','.join(p['fallback']) or '-':<24} {p['template'] or '-'}")
    for org, name in shown["org_defaults"].items():
        out.print(f"org {org}: {name}")
    out.print(f"fleet default: {shown['fleet_default'] or '-'}")
