"""Before any customer code runs: claim, policy, permit, capacity, sandbox.

Every failure here is pre-code: hold, throttle and provider pushback defer the
attempt (bounded); a full org is a terminal SANDBOX_CAPACITY_EXCEEDED; auth and
unknown provider errors end the run SANDBOX_START_FAILED. Acquisition stops once the
provider has made the sandbox: the launch records it live (tasks/execution/launch.py, one
transaction with the launch record), and what ends a run is the caller's (tasks/worker/jobs.py).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from tasks.acquisition import capacity, permits, placement
from tasks.acquisition import policy as traffic
from tasks.acquisition.claim import Claimed, Skipped, claim
from tasks.acquisition.deferral import defer
from tasks.acquisition.first_start import first_start
from tasks.acquisition.pools import stats as pool_stats
from tasks.acquisition.sandbox import create
from tasks.constants import CAPACITY_EXCEEDED_MESSAGE, SANDBOX_START_FAILED
from tasks.errors import CapacityExceededError
from tasks.observe import metrics
from tasks.sandbox import ProviderError, SandboxProvider, SandboxRef
from tasks.sandbox.runtime import provider as provider_for
from tasks.sandbox.runtime import worker_id
from tasks.settings import Settings
from tasks.store.db import session_scope

log = logging.getLogger("playrun.start")

# A create refused for these passes the attempt to the policy's next provider.
_FAIL_OVER = frozenset({"capacity_unavailable", "transport", "auth"})
_PROVIDER_CAUSE = {
    "capacity_unavailable": "provider_capacity",
    "rate_limited": "provider_rate_limited",
    "transport": "transport",
}


class Step(enum.Enum):
    LIVE = "live"  # the sandbox is recorded live: launch it
    DEFERRED = "deferred"  # waits durably (or was settled by the deferral: cancel, budget)
    FAILED = "failed"  # a terminal failure before code: the caller finishes the run


@dataclass(frozen=True)
class Acquired:
    step: Step
    ref: SandboxRef | None = None
    lease_id: str | None = None  # the capacity reservation the sandbox's launch promotes
    code: str = ""
    error: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Opened:
    """The claim's transaction also read the traffic policy and reserved capacity."""

    claimed: Claimed
    policy: traffic.Policy
    lease_id: str | None = None  # the capacity reservation, unless held or full
    full: CapacityExceededError | None = None  # the org was full (enforce mode)
    provider_full: bool = False  # PLAYRUN_PROVIDER_MAX_LIVE sandboxes are live already


# Transactions before launch commit without waiting for the WAL flush (durable=False): a
# crash that loses one loses everything after it too, until the launch record, which is
# durable and flushes them before exec. Losing them is recovered like a lost worker.

def open_attempt(run_id: str, settings: Settings,
                 routed: str | None = None) -> Opened | Skipped:
    """Claim, read the policy and reserve capacity: the run row is locked, then the org's
    capacity row (the order every capacity write takes).

    On PostgreSQL a due first start is one statement that also reads the policy
    (tasks/acquisition/first_start.py); anything else, and SQLite, takes one transaction
    that claims, reads the policy and reserves.
    """
    policy: traffic.Policy | None = None
    # A provider pool is a second lease: the one-statement first start takes only one.
    if settings.is_postgres and settings.provider_max_live is None:
        opened = _first_start(run_id, settings)
        if opened is not None:
            return opened
    with session_scope(durable=False) as session:
        claimed = claim(session, run_id, worker_id=worker_id(),
                        lease_seconds=settings.lease_seconds)
        if isinstance(claimed, Skipped):
            return claimed
        if policy is None:
            policy = traffic.current(session)
        if policy.mode == traffic.HOLD:
            return Opened(claimed, policy)
        try:
            # A full org takes no slot here (only the no-op lock of its org row), so the
            # claim still commits and the deferral parks the attempt.
            reservation = capacity.reserve(session, claimed.fence, claimed.org_id, settings)
        except CapacityExceededError as exc:
            return Opened(claimed, policy, full=exc)
        if settings.provider_max_live is not None and capacity.reserve_pool(
                session, claimed.fence, pool_provider(routed, settings),
                settings.provider_max_live,
                settings, reservation.lease_id) is None:
            return Opened(claimed, policy, provider_full=True)
        return Opened(claimed, policy, reservation.lease_id)


def _first_start(run_id: str, settings: Settings) -> Opened | None:
    """Attempt 1, the policy and (unless held) its reservation in one statement; None for
    anything but a due first start."""
    started = first_start(
        run_id, worker_id=worker_id(), lease_seconds=settings.lease_seconds, reserve=True,
        org_capacity=settings.org_capacity, observe=settings.capacity_mode != "enforce",
        reservation_ttl_s=settings.capacity_reservation_ttl_s)
    if started is None:
        return None
    policy = started.policy
    if policy.mode == traffic.HOLD:
        return Opened(started.claimed, policy)
    if not started.reserved:  # a hold row not in force (expired by now, unsound, overridden)
        return _reserve_apart(started.claimed, policy, settings)
    if started.lease_id is None:
        return Opened(started.claimed, policy, full=CapacityExceededError(
            CAPACITY_EXCEEDED_MESSAGE))
    return Opened(started.claimed, policy, started.lease_id)


def _reserve_apart(claimed: Claimed, policy: traffic.Policy, settings: Settings) -> Opened:
    with session_scope(durable=False) as session:
        try:
            reservation = capacity.reserve(session, claimed.fence, claimed.org_id, settings)
        except CapacityExceededError as exc:
            return Opened(claimed, policy, full=exc)
    return Opened(claimed, policy, reservation.lease_id)


_DEFERRED = Acquired(Step.DEFERRED)


def acquire_sandbox(opened: Opened, settings: Settings, routed: str | None = None,
                    past_permit: Callable[[], None] | None = None) -> Acquired:
    """Raises FenceLostError when the attempt lost its fence on the way. `routed`: the
    provider the start message was placed on, if any; `past_permit` is called once a
    start permit is decided (the fair relay's window)."""
    claimed, policy = opened.claimed, opened.policy
    fence = claimed.fence
    if policy.mode == traffic.HOLD:
        defer(fence, "hold", settings, detail="hold_new_sandbox_starts is in force",
              provider=routed)
        return _DEFERRED
    # Capacity first: a run that waits for its org's capacity burns no start permit.
    if opened.full is not None:
        exc = opened.full
        if settings.capacity_full == "defer":
            defer(fence, "capacity", settings, detail=exc.message, provider=routed)
            return _DEFERRED
        return Acquired(Step.FAILED, code=exc.code, error=f"{exc.code}: {exc.message}",
                        reason="capacity")
    pooled = pool_provider(routed, settings)
    if opened.provider_full:  # never a play failure: the provider's slots come back
        defer(fence, "provider_capacity", settings, provider=routed,
              detail=f"{settings.provider_max_live} {pooled} sandboxes live "
                     "(PLAYRUN_PROVIDER_MAX_LIVE)")
        return _DEFERRED
    lease_id = opened.lease_id
    assert lease_id is not None  # open_attempt reserved it: not held, not full
    placed = placement.place(fence, routed) \
        if routed is not None or len(settings.served) > 1 or settings.placement_default \
        else None
    if placed is None:
        own = routed if routed in settings.served else settings.primary_provider
        got = _create_on(provider_for(own), claimed, policy, lease_id, settings,
                         can_fail_over=False, past_permit=past_permit)
        assert isinstance(got, Acquired)
        return got
    return _create_placed(placed, pooled, claimed, policy, lease_id, settings, past_permit)


def pool_provider(routed: str | None, settings: Settings) -> str:
    """The provider whose PLAYRUN_PROVIDER_MAX_LIVE slot open_attempt takes."""
    return routed if routed in settings.served and routed else settings.primary_provider


def _create_placed(placed: placement.Placed, pooled: str, claimed: Claimed,
                   policy: traffic.Policy, lease_id: str, settings: Settings,
                   past_permit: Callable[[], None] | None) -> Acquired:
    """Each candidate provider in turn, within this attempt and its one capacity lease."""
    fence = claimed.fence
    name_of = placed.policy.name
    cause: str | None = None
    last = len(placed.candidates) - 1
    for index, (name, reason) in enumerate(placed.candidates):
        why = reason if cause is None else f"fallback after {cause}"
        if index < last and placement.circuit_open(name, settings):
            cause = "circuit_open"
            metrics.failover(name, cause)
            continue
        if name not in settings.served:
            # Another worker serves it: the attempt waits on that provider's queue.
            placement.record(fence, name, name_of, why)
            defer(fence, "placement", settings, provider=name,
                  detail=f"placed on {name}, which this worker does not serve")
            return _DEFERRED
        if name != pooled:
            if not placement.move_pool(fence, pooled, name, settings):
                defer(fence, "provider_capacity", settings, provider=name,
                      detail=f"{settings.provider_max_live} {name} sandboxes live "
                             "(PLAYRUN_PROVIDER_MAX_LIVE)")
                return _DEFERRED
            pooled = name
        placement.record(fence, name, name_of, why)
        provider = provider_for(name)
        got = _create_on(provider, claimed, policy, lease_id, settings,
                         can_fail_over=index < last, resume_on=placed.candidates[0][0],
                         past_permit=past_permit)
        if isinstance(got, Acquired):
            return got
        try:
            # A create whose answer was lost may have made a sandbox: gone before the next.
            placement.clean_up(provider, fence)
        except ProviderError as exc:
            defer(fence, "transport", settings, provider=name,
                  detail=f"cannot confirm no {name} sandbox is left: {str(exc)[:150]}")
            return _DEFERRED
        cause = got
        metrics.failover(name, cause)
    raise AssertionError("the last candidate never fails over")


def _create_on(provider: SandboxProvider, claimed: Claimed, policy: traffic.Policy,
               lease_id: str, settings: Settings, *, can_fail_over: bool,
               resume_on: str | None = None,
               past_permit: Callable[[], None] | None = None) -> Acquired | str:
    """Permit and create on one provider: the Acquired step, or the cause (an error kind)
    to fail over for. A rate limit defers on this provider; a refusal of the last
    candidate defers the attempt to `resume_on` (the first) for a later full pass."""
    fence = claimed.fence
    placed = resume_on is not None or can_fail_over
    here = provider.name if placed else None
    published = getattr(provider, "create_rate_per_min", None)
    decision = permits.acquire(provider.name, policy, settings, published)
    if past_permit is not None:
        past_permit()
    if decision.granted:
        metrics.start(claimed.org_id)
    else:
        pool_stats.note_waiting(provider.name)  # its warm pools' refills yield to runs
        defer(fence, "throttle", settings, at_least_ms=decision.wait_ms, provider=here,
              detail=f"start rate {decision.rate:g}/min")
        return _DEFERRED
    try:
        ref = create(provider, claimed, settings, lease_id)
    except ProviderError as exc:
        metrics.provider_create(provider.name, exc.kind)
        if exc.kind in ("transport", "auth"):
            placement.note_failure(provider.name, settings)
        cause = _PROVIDER_CAUSE.get(exc.kind)
        if cause != "transport" and cause is not None:
            # Its own bucket learns; the next provider's does not.
            permits.penalize(provider.name, policy, decision.epoch, settings, published,
                             retry_after_s=exc.retry_after_s,
                             refused_rate=decision.rate if exc.kind == "rate_limited" else None)
        if can_fail_over and exc.kind in _FAIL_OVER:
            return exc.kind
        if cause is None:
            return Acquired(Step.FAILED, code=SANDBOX_START_FAILED, error=str(exc),
                            reason="start_failed")
        # The server's own Retry-After is a floor: asking sooner only earns another refusal.
        floor_ms = int(min(exc.retry_after_s or 0.0, settings.deferral_max_ms / 1000) * 1000)
        again = here if exc.kind == "rate_limited" or not placed else resume_on
        defer(fence, cause, settings, detail=str(exc)[:200],  # type: ignore[arg-type]
              at_least_ms=floor_ms, provider=again)
        return _DEFERRED
    metrics.provider_create(provider.name, "ok")
    if placed:
        placement.note_success(provider.name)
    permits.accepted(provider.name)  # the adaptive rate grows on real starts only
    # The launch records the sandbox live and promotes the lease, in its own transaction.
    return Acquired(Step.LIVE, ref=ref, lease_id=lease_id)
