"""`playrun pool`: warm sandboxes kept ready per placement policy."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from tasks.cli.output import console as plain_console

pool_app = typer.Typer(help="Warm pools: ready sandboxes that start a run in milliseconds.",
                       no_args_is_help=True)


@pool_app.command("set")
def set_pool(
    policy: Annotated[str, typer.Argument(
        help="A placement policy's name, or `default` for runs that name none.")],
    min_ready: Annotated[int, typer.Option("--min", help="Warm sandboxes kept ready.")],
    max_ready: Annotated[int, typer.Option("--max", help="Never more ready than this.")],
    ttl: Annotated[str | None, typer.Option(
        "--ttl", help="A warm sandbox older than this is replaced (e.g. 30m; default 30m).")]
    = None,
    provider: Annotated[str | None, typer.Option(
        "--provider", help="For `default`: the provider (the fleet's own if not given).")]
    = None,
) -> None:
    """Create or change a pool; refills start at beat's next tick."""
    from tasks.acquisition.pools import config

    pool = config.set_pool(config.build(policy, min_ready, max_ready, ttl, provider))
    typer.echo(json.dumps(pool.as_dict()))


@pool_app.command("remove")
def remove(policy: Annotated[str, typer.Argument(help="The pool's name.")]) -> None:
    """Remove a pool; its warm sandboxes are deleted."""
    from tasks.acquisition.pools import config

    retired = config.remove_pool(policy)
    typer.echo(json.dumps({"removed": policy, "retired": retired}))


@pool_app.command("show")
def show(as_json: bool = typer.Option(False, "--json", help="One JSON document.")) -> None:
    """Each pool: bounds, ready, claiming, refilling, claims, misses and hit rate."""
    from tasks.acquisition.pools import view

    shown = view.show()
    if as_json:
        typer.echo(json.dumps({"pools": shown}))
        return
    out = plain_console()
    out.print(f"{'POOL':<16} {'PROVIDER':<10} {'MIN':>4} {'MAX':>4} {'TTL':>7} {'READY':>6} "
              f"{'CLAIMING':>9} {'REFILLING':>10} {'CLAIMS':>7} {'MISSES':>7} {'HIT':>6}")
    for p in shown:
        hit = f"{p['hit_rate'] * 100:.0f}%" if p["hit_rate"] is not None else "-"
        out.print(f"{p['name']:<16} {p['provider']:<10} {p['min_ready']:>4} {p['max_ready']:>4} "
                  f"{p['ttl_s']:>6g}s {p['ready']:>6} {p['claiming']:>9} {p['refilling']:>10} "
                  f"{p['claims']:>7} {p['misses']:>7} {hit:>6}")
    if not shown:
        out.print("no pools (playrun pool set POLICY --min N --max M)")
