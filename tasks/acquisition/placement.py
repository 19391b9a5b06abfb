"""Where an attempt's sandbox is made: the policy's choice, recorded once per attempt,
and the failover to the next provider within the same attempt.

The choice is a pure function of the run's policy and id (tasks/admission/placement.py);
the attempt records the provider it is on (attempts.placed_provider and a
`placement.chosen` ledger event), so its deferrals resume there. Failover never takes a
second org capacity lease: the attempt keeps the one it reserved, and a create that may
have succeeded is found by the attempt's labels and deleted before the next provider.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis
import sqlalchemy as sa

from models import Attempt, CapacityLease, Run
from tasks.acquisition import capacity
from tasks.admission.placement import Policy, order, policy_named
from tasks.constants import (
    KEY_POOL_HOSTS,
    KEY_PROVIDER_CIRCUIT,
    KEY_SERVED_PROVIDERS,
    LABEL_GENERATION,
    LABEL_RUN,
    EventKind,
    LeaseState,
)
from tasks.errors import CapacityExceededError
from tasks.observe import metrics
from tasks.sandbox import ProviderError, SandboxProvider
from tasks.sandbox.runtime import host_queue
from tasks.settings import Settings
from tasks.store import ledger
from tasks.store.db import session_scope
from tasks.store.fence import Fence, hold
from tasks.store.notify import redis_client

log = logging.getLogger("playrun.placement")

# A worker's announcement lasts this long; each worker renews it well before.
ANNOUNCE_S = 900.0
_RENEW_S = 300.0
_announced = {"at": 0.0}


def announce(served: tuple[str, ...]) -> None:
    """Tell `placement set` which providers this worker serves."""
    until = time.time() + ANNOUNCE_S
    client = redis_client()
    client.hset(KEY_SERVED_PROVIDERS, mapping={name: f"{until:.0f}" for name in served})
    local = host_queue("local") if "local" in served else None
    if local is not None:  # warm local sandboxes are kept per host: beat asks each host
        client.hset(KEY_POOL_HOSTS, local, f"{until:.0f}")
    _announced["at"] = time.monotonic()


def pool_hosts(now: float | None = None) -> list[str]:
    """The host queues of workers serving `local` that announced themselves lately."""
    raw: dict[Any, Any] = redis_client().hgetall(KEY_POOL_HOSTS)  # type: ignore[assignment]
    now = time.time() if now is None else now
    out = []
    for name, until in raw.items():
        with contextlib.suppress(TypeError, ValueError):
            if float(until) > now:
                out.append(name.decode() if isinstance(name, bytes) else str(name))
    return sorted(out)


def renew(served: tuple[str, ...]) -> None:
    if time.monotonic() - _announced["at"] < _RENEW_S:
        return
    try:
        announce(served)
    except redis.RedisError as exc:
        log.warning("cannot renew the providers this worker serves: %s", exc)


@dataclass(frozen=True)
class Placed:
    policy: Policy
    # (provider, reason) from the one the attempt is on, in the order it tries them.
    candidates: list[tuple[str, str]]
    recorded: str | None  # the provider this attempt recorded already, if any


def place(fence: Fence, routed: str | None) -> Placed | None:
    """The attempt's candidates; None when the run has no policy (or its policy is gone):
    the worker's own provider serves it. A start placed on a provider (`routed`: a
    deferral's or a hand-off's) resumes there; any other starts from the policy's top."""
    with session_scope(readonly=True) as session:
        row = session.execute(
            sa.select(Run.placement, Attempt.placed_provider)
            .join(Attempt, Attempt.run_id == Run.id)
            .where(Run.id == fence.run_id, Attempt.generation == fence.generation)).first()
    if row is None or row[0] is None:
        return None
    policy = policy_named(row[0])
    if policy is None:
        log.warning("run %s names placement %r, which no longer exists: served by the "
                    "worker's own provider", fence.run_id, row[0])
        return None
    candidates = order(policy, fence.run_id)
    names = [name for name, _ in candidates]
    if routed in names and row[1] is not None:  # this attempt was placed already
        candidates = candidates[names.index(routed):]
    return Placed(policy, candidates, row[1])


def record(fence: Fence, provider: str, policy: str, reason: str) -> None:
    """The attempt is placed on `provider` (one ledger event per provider it is placed on)."""
    with session_scope(durable=False) as session:
        _run, attempt = hold(session, fence)
        if attempt.placed_provider == provider:
            return
        attempt.placed_provider = provider
        ledger.append(session, fence.run_id, EventKind.PLACEMENT_CHOSEN,
                      {"provider": provider, "policy": policy, "reason": reason},
                      fence.generation)
    metrics.placed(provider, reason)


def move_pool(fence: Fence, old: str, new: str, settings: Settings) -> bool:
    """Pass the attempt's PLAYRUN_PROVIDER_MAX_LIVE slot from one provider to the next;
    False (the old slot kept) when the new provider's pool is full."""
    if settings.provider_max_live is None:
        return True
    with session_scope(durable=False) as session:
        hold(session, fence)
        try:
            capacity.reserve(session, fence, capacity.pool_for(new), settings,
                             default=settings.provider_max_live, observe=False)
        except CapacityExceededError:
            return False
        session.execute(sa.delete(CapacityLease).where(
            CapacityLease.org_id == capacity.pool_for(old),
            CapacityLease.run_id == fence.run_id,
            CapacityLease.generation == fence.generation,
            CapacityLease.state == LeaseState.RESERVED))
    return True


# Circuits: a provider whose creates keep failing (transport, auth) is skipped for a while.

def circuit_open(name: str, settings: Settings) -> bool:
    try:
        raw = redis_client().get(KEY_PROVIDER_CIRCUIT + name)
    except redis.RedisError:
        return False  # no Redis: every provider is tried
    try:
        return int(raw or 0) >= settings.provider_circuit_failures  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def note_failure(name: str, settings: Settings) -> None:
    try:
        pipe = redis_client().pipeline(transaction=False)
        pipe.incr(KEY_PROVIDER_CIRCUIT + name)
        pipe.expire(KEY_PROVIDER_CIRCUIT + name, int(settings.provider_circuit_open_s))
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("cannot count a failure of provider %s: %s", name, exc)


def note_success(name: str) -> None:
    with contextlib.suppress(redis.RedisError):  # the count expires on its own
        redis_client().delete(KEY_PROVIDER_CIRCUIT + name)


def clean_up(provider: SandboxProvider, fence: Fence) -> int:
    """Delete whatever a create that failed on its way back may have made for this
    attempt (found by its labels); raises ProviderError when it cannot be sure."""
    found = provider.list({LABEL_RUN: fence.run_id, LABEL_GENERATION: str(fence.generation)})
    for ref in found:
        try:
            provider.delete(ref.sandbox_id)
        except ProviderError as exc:
            if exc.kind != "not_found":
                raise
    if found:
        log.warning("deleted %d sandbox(es) %s made for run %s before failing over",
                    len(found), provider.name, fence.run_id)
    return len(found)
