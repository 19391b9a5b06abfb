"""`playrun policy` and `playrun capacity`: the traffic policy and per-org capacity."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from tasks.cli.output import console, utc_iso
from tasks.cli.tables import Column, Table, show
from tasks.errors import PolicyInvalidError
from tasks.parse.checks import (
    check_org_id,
    check_rate,
    check_weight,
    parse_count,
    parse_number,
)

# Numbers as positional arguments: let `-1` reach our checks instead of reading as an option.
NUMERIC_ARGS: dict[str, Any] = {"ignore_unknown_options": True}

policy_app = typer.Typer(help="Traffic policy for sandbox starts.", no_args_is_help=True)
capacity_app = typer.Typer(help="Per-org sandbox capacity.", no_args_is_help=True)


@policy_app.command("show")
def policy_show() -> None:
    """Print the policy in force as JSON: mode, start rate, when it expires."""
    from tasks.acquisition import policy

    p = policy.read()
    print(json.dumps({"mode": p.mode, "sandbox_starts_per_minute": p.starts_per_minute,
                      "expires_at": utc_iso(p.expires_at) if p.expires_at else None}))


@policy_app.command("hold")
def policy_hold(for_: Annotated[str, typer.Option("--for", help="e.g. 10m, 1h")] = "10m",
                reason: str | None = None) -> None:
    """Hold new sandbox starts for a while (runs are deferred, not failed)."""
    from tasks.acquisition import policy
    from tasks.parse.durations import parse_duration

    policy.set_policy(policy.HOLD, for_s=parse_duration(for_), reason=reason)
    policy_show()


@policy_app.command("throttle", context_settings=NUMERIC_ARGS)
def policy_throttle(per_minute: Annotated[str, typer.Argument(metavar="PER_MINUTE")],
                    for_: Annotated[str, typer.Option("--for", help="e.g. 10m, 1h")] = "1h",
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
    """End a hold or throttle now: the adaptive start rate applies again."""
    from tasks.acquisition import policy

    policy.set_policy(policy.NORMAL, for_s=None)
    policy_show()


@capacity_app.command("show")
def capacity_show() -> None:
    """The default limit, and each org's limit, reserved and live sandboxes and weight."""
    from tasks.acquisition import capacity
    from tasks.settings import get_settings

    settings = get_settings()
    out = console()
    weights = capacity.weights()
    found = capacity.show(settings.org_capacity)
    listed = {org for org, *_ in found}
    found += [(org, settings.org_capacity, 0, 0) for org in sorted(set(weights) - listed)]
    rows = [(org, str(limit), str(reserved), str(live), str(weights.get(org, 1)))
            for org, limit, reserved, live in found]
    out.print(f"default limit {settings.org_capacity} per org, mode {settings.capacity_mode}, "
              f"start order {settings.start_order}", markup=False)
    show(out, Table((Column("org", flex=True), Column("limit"), Column("reserved"),
                     Column("live"), Column("weight")), rows))


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
