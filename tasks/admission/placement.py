"""Placement policies: parsed and stored here, resolved for each run at admission.

A policy names a primary provider, optionally a canary provider with a share of runs,
and a fallback order. Which provider a run's attempt starts on is a pure function of the
policy and the run id (a hash against the canary share), so every retry, worker and
dashboard agrees on it; the worker records the choice (tasks/acquisition/placement.py).
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis
import sqlalchemy as sa

from models import OrgPlacement, PlacementPolicy, db_now
from tasks.constants import KEY_SERVED_PROVIDERS
from tasks.errors import PlacementInvalidError, PlacementUnknownError, PlacementUnservedError
from tasks.parse.checks import check_org_id
from tasks.sandbox import providers
from tasks.settings import Settings, get_settings
from tasks.store.db import session_scope
from tasks.store.notify import redis_client

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_TEMPLATE_MAX = 200
MAX_FALLBACKS = 8
# Policies read at admission are this fresh at worst; an unknown name reloads first.
_CACHE_S = 2.0


class Reason:
    """Why an attempt went where it went (the `reason` of `placement.chosen`)."""

    PRIMARY = "primary"
    CANARY = "canary"
    FALLBACK = "fallback"  # recorded as "fallback after <cause>"


@dataclass(frozen=True)
class Policy:
    name: str
    provider: str
    template: str | None = None
    canary_provider: str | None = None
    canary_pct: float = 0.0
    fallback: tuple[str, ...] = field(default_factory=tuple)

    def providers(self) -> tuple[str, ...]:
        names = [self.provider, *([self.canary_provider] if self.canary_provider else []),
                 *self.fallback]
        return tuple(dict.fromkeys(names))

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "provider": self.provider, "template": self.template,
                "canary": (f"{self.canary_provider}:{self.canary_pct:g}"
                           if self.canary_provider else None),
                "fallback": list(self.fallback)}


def check_name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        shown = repr(value)[:60]
        raise PlacementInvalidError(
            f"placement name {shown} must be 1-40 of a-z, 0-9, '-' and '_', "
            "starting with a letter or digit")
    return value


def _check_provider(value: Any, what: str) -> str:
    if not isinstance(value, str) or value not in providers.known():
        raise PlacementInvalidError(
            f"{what} {repr(value)[:60]} is not a sandbox provider; known: "
            f"{', '.join(providers.known())}")
    return value


def parse_canary(text: str | None) -> tuple[str | None, float]:
    """`PROVIDER:PCT`, PCT a share of runs above 0 and at most 100."""
    if text is None or text == "":
        return None, 0.0
    name, sep, pct = text.partition(":")
    if not sep:
        raise PlacementInvalidError(f"canary {text[:60]!r} is not PROVIDER:PERCENT")
    try:
        share = float(pct)
    except ValueError:
        raise PlacementInvalidError(f"canary share {pct[:20]!r} is not a number") from None
    if not 0 < share <= 100:
        raise PlacementInvalidError(f"canary share {share:g} is not in (0, 100]")
    return _check_provider(name, "canary provider"), share


def parse_fallback(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    names = tuple(n.strip() for n in text.split(","))
    if len(names) > MAX_FALLBACKS:
        raise PlacementInvalidError(f"at most {MAX_FALLBACKS} fallback providers")
    if len(set(names)) != len(names):
        raise PlacementInvalidError("a fallback provider is named twice")
    return tuple(_check_provider(n, "fallback provider") for n in names)


def build(name: Any, provider: Any, *, template: Any = None, canary: str | None = None,
          fallback: str | None = None) -> Policy:
    """A checked policy from an operator's input; PLACEMENT_INVALID names what is wrong."""
    checked = check_name(name)
    primary = _check_provider(provider, "provider")
    if template is not None and (not isinstance(template, str) or not template
                                 or len(template) > _TEMPLATE_MAX):
        raise PlacementInvalidError(f"template must be 1-{_TEMPLATE_MAX} characters")
    canary_provider, share = parse_canary(canary)
    if canary_provider == primary:
        raise PlacementInvalidError("the canary provider is the primary provider")
    fallbacks = parse_fallback(fallback)
    if primary in fallbacks:
        raise PlacementInvalidError("the primary provider is also a fallback")
    return Policy(checked, primary, template, canary_provider, share, fallbacks)


def canary_point(run_id: str) -> float:
    """Where a run falls in [0, 100): a hash, so the pick needs no state and never flips."""
    digest = hashlib.sha256(run_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % 1_000_000 / 10_000


def order(policy: Policy, run_id: str) -> list[tuple[str, str]]:
    """Every provider an attempt may use, with why, in the order it tries them."""
    if policy.canary_provider and canary_point(run_id) < policy.canary_pct:
        first = [(policy.canary_provider, Reason.CANARY), (policy.provider, Reason.FALLBACK)]
    else:
        first = [(policy.provider, Reason.PRIMARY)]
    out: dict[str, str] = {}
    for name, reason in [*first, *((n, Reason.FALLBACK) for n in policy.fallback)]:
        out.setdefault(name, reason)
    return list(out.items())


def first_provider(policy: Policy, run_id: str) -> str:
    return order(policy, run_id)[0][0]


# Store ------------------------------------------------------------------------------

def _policy(row: PlacementPolicy) -> Policy:
    return Policy(row.name, row.provider, row.template, row.canary_provider,
                  float(row.canary_pct), tuple(row.fallback or ()))


def served_now(now: float | None = None) -> set[str]:
    """Providers some worker announced it serves, and has not stopped announcing."""
    raw: dict[Any, Any] = redis_client().hgetall(KEY_SERVED_PROVIDERS)  # type: ignore[assignment]
    now = time.time() if now is None else now
    out: set[str] = set()
    for name, until in raw.items():
        try:
            if float(until) > now:
                out.add(name.decode() if isinstance(name, bytes) else str(name))
        except (TypeError, ValueError):
            continue
    return out


def set_policy(policy: Policy, *, check_served: bool = True) -> Policy:
    """Create or replace a policy; refused (nothing written) when a provider it names is
    served by no worker, unless check_served is off (policies set up before workers)."""
    if check_served:
        try:
            served = served_now()
        except redis.RedisError as exc:
            raise PlacementUnservedError(
                f"cannot read which providers workers serve ({exc}); use --unchecked") from exc
        missing = [n for n in policy.providers() if n not in served]
        if missing:
            raise PlacementUnservedError(
                f"no worker serves {', '.join(missing)} (workers serve: "
                f"{', '.join(sorted(served)) or 'none'}); start one or use --unchecked")
    with session_scope() as session:
        row = session.get(PlacementPolicy, policy.name, with_for_update=True)
        if row is None:
            row = PlacementPolicy(name=policy.name)
            session.add(row)
        row.provider = policy.provider
        row.template = policy.template
        row.canary_provider = policy.canary_provider
        row.canary_pct = policy.canary_pct
        row.fallback = list(policy.fallback)
        row.updated_at = db_now()
    _cache.clear()
    return policy


def set_default(org_id: Any, name: Any) -> None:
    org = check_org_id(org_id)
    checked = check_name(name)
    with session_scope() as session:
        if session.get(PlacementPolicy, checked) is None:
            raise PlacementUnknownError(f"no placement policy named {checked!r}")
        row = session.get(OrgPlacement, org, with_for_update=True)
        if row is None:
            session.add(OrgPlacement(org_id=org, policy=checked))
        else:
            row.policy = checked
            row.updated_at = db_now()
    _cache.clear()


def show() -> dict[str, Any]:
    with session_scope(readonly=True) as session:
        policies = [_policy(r) for r in session.scalars(
            sa.select(PlacementPolicy).order_by(PlacementPolicy.name))]
        defaults = {org: name for org, name in session.execute(
            sa.select(OrgPlacement.org_id, OrgPlacement.policy).order_by(OrgPlacement.org_id))}
    return {"policies": [p.as_dict() for p in policies], "org_defaults": defaults,
            "fleet_default": get_settings().placement_default}


def listing(max_defaults: int) -> tuple[list[Policy], list[tuple[str, str]], int]:
    """Every policy, at most `max_defaults` org defaults (by org) and how many more there are."""
    with session_scope(readonly=True) as session:
        policies = [_policy(r) for r in session.scalars(
            sa.select(PlacementPolicy).order_by(PlacementPolicy.name))]
        defaults = [(str(org), str(name)) for org, name in session.execute(
            sa.select(OrgPlacement.org_id, OrgPlacement.policy)
            .order_by(OrgPlacement.org_id).limit(max_defaults))]
        total = int(session.scalar(sa.select(sa.func.count()).select_from(OrgPlacement)) or 0)
    return policies, defaults, max(0, total - len(defaults))


class _Cache:
    """Every policy and org default, read at most every _CACHE_S per process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaded = 0.0
        self.policies: dict[str, Policy] = {}
        self.defaults: dict[str, str] = {}

    def clear(self) -> None:
        self.loaded = 0.0

    def get(self, *, fresh: bool = False) -> tuple[dict[str, Policy], dict[str, str]]:
        with self.lock:
            if fresh or time.monotonic() - self.loaded > _CACHE_S:
                with session_scope(readonly=True) as session:
                    self.policies = {r.name: _policy(r)
                                     for r in session.scalars(sa.select(PlacementPolicy))}
                    self.defaults = {org: name for org, name in session.execute(
                        sa.select(OrgPlacement.org_id, OrgPlacement.policy))}
                self.loaded = time.monotonic()
            return self.policies, self.defaults


_cache = _Cache()


def policy_named(name: str) -> Policy | None:
    policies, _ = _cache.get()
    found = policies.get(name)
    if found is None:
        found = _cache.get(fresh=True)[0].get(name)
    return found


def resolve(org_id: str, name: Any, settings: Settings | None = None) -> Policy | None:
    """The run's policy: the one named, else its org's default, else the fleet's; None
    when none applies (the worker's own provider serves it). PLACEMENT_UNKNOWN when a
    named policy does not exist: nothing is admitted."""
    settings = settings or get_settings()
    if name is None:
        _, defaults = _cache.get()
        name = defaults.get(org_id) or settings.placement_default
        if name is None:
            return None
    checked = check_name(name)
    found = policy_named(checked)
    if found is None:
        raise PlacementUnknownError(f"no placement policy named {checked!r}")
    return found
