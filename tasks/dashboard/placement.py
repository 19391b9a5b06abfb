"""The fleet page's placement section: policies, org defaults, and per provider whether a
worker serves it, its live sandboxes, its pool, its circuit and recent placement reasons."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import redis

from tasks.acquisition import capacity, placement_view
from tasks.acquisition.placement import circuit_open
from tasks.admission.placement import Policy, listing, served_now
from tasks.settings import Settings
from tasks.store.db import session_scope

log = logging.getLogger("playrun.dashboard")

MAX_DEFAULTS = 200  # org defaults shown; the rest are counted


@dataclass(frozen=True)
class ProviderRow:
    name: str
    served: bool | None  # a worker announced it serves it (None: Redis did not answer)
    live: int  # sandboxes recorded live
    pool: int | None  # PLAYRUN_PROVIDER_MAX_LIVE slots held, when that limit is set
    circuit_open: bool | None  # None: Redis did not answer
    recent: dict[str, int] = field(default_factory=dict)  # reason -> recent placements


@dataclass(frozen=True)
class Placement:
    policies: list[Policy]
    defaults: list[tuple[str, str]]  # (org, policy)
    defaults_hidden: int
    fleet_default: str | None
    providers: list[ProviderRow]
    pool_limit: int | None
    recent_window: int
    redis_error: str | None = None


def placement(settings: Settings, held: dict[str, int]) -> Placement:
    """`held`: leases held by org, as the capacity table read them (pools included)."""
    policies, defaults, hidden = listing(MAX_DEFAULTS)
    with session_scope(readonly=True) as session:
        live = placement_view.live_by_provider(session)
        recent = placement_view.recent_placements(session)
    served: set[str] | None = None
    error = None
    try:
        served = served_now()
    except redis.RedisError as exc:
        log.warning("which providers workers serve is unavailable: %s", exc)
        error = f"Redis did not answer ({type(exc).__name__})"
    pools = {org.removeprefix(capacity.POOL_PREFIX): n for org, n in held.items()
             if org.startswith(capacity.POOL_PREFIX)}
    names = sorted({*settings.served, *(served or ()), *live, *recent, *pools,
                    *(n for p in policies for n in p.providers())})
    rows = [ProviderRow(
        name, None if served is None else name in served, live.get(name, 0),
        pools.get(name, 0) if settings.provider_max_live is not None else None,
        None if served is None else circuit_open(name, settings),
        dict(sorted(recent.get(name, {}).items(), key=lambda kv: (-kv[1], kv[0]))))
        for name in names]
    return Placement(policies, defaults, hidden, settings.placement_default, rows,
                     settings.provider_max_live, placement_view.RECENT_EVENTS, error)
