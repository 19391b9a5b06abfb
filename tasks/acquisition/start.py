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
from typing import Any

from tasks.acquisition import capacity, permits
from tasks.acquisition import policy as traffic
from tasks.acquisition.claim import Claimed, Skipped, claim
from tasks.acquisition.deferral import defer
from tasks.acquisition.first_start import first_start
from tasks.acquisition.sandbox import create
from tasks.constants import CAPACITY_EXCEEDED_MESSAGE, SANDBOX_START_FAILED
from tasks.errors import CapacityExceededError
from tasks.observe import metrics
from tasks.sandbox import ProviderError, SandboxProvider, SandboxRef
from tasks.sandbox.runtime import provider as provider_for
from tasks.sandbox.runtime import worker_id
from tasks.settings import Settings
from tasks.store.db import driver_cursor, session_scope

log = logging.getLogger("playrun.start")

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


# Transactions before launch commit without waiting for the WAL flush (durable=False): a
# crash that loses one loses everything after it too, until the launch record, which is
# durable and flushes them before exec. Losing them is recovered like a lost worker.

def open_attempt(run_id: str, settings: Settings) -> Opened | Skipped:
    """Claim, read the policy and reserve capacity: the run row is locked, then the org's
    capacity row (the order every capacity write takes).

    On PostgreSQL the policy is read first, on its own, and a due first start is then one
    statement (tasks/acquisition/first_start.py); anything else, and SQLite, takes one
    transaction that claims, reads the policy (unless read already) and reserves.
    """
    policy: traffic.Policy | None = None
    if settings.is_postgres:
        with driver_cursor() as cur:
            policy = traffic.current_pg(cur)
        opened = _first_start(run_id, settings, policy)
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
        return Opened(claimed, policy, reservation.lease_id)


def _first_start(run_id: str, settings: Settings, policy: traffic.Policy) -> Opened | None:
    """Attempt 1 and (unless held) its reservation in one statement; None for anything
    but a due first start."""
    started = first_start(
        run_id, worker_id=worker_id(), lease_seconds=settings.lease_seconds,
        reserve=policy.mode != traffic.HOLD, org_capacity=settings.org_capacity,
        observe=settings.capacity_mode != "enforce",
        reservation_ttl_s=settings.capacity_reservation_ttl_s)
    if started is None:
        return None
    if not started.reserved:
        return Opened(started.claimed, policy)
    if started.lease_id is None:
        return Opened(started.claimed, policy, full=CapacityExceededError(
            CAPACITY_EXCEEDED_MESSAGE))
    return Opened(started.claimed, policy, started.lease_id)


_DEFERRED = Acquired(Step.DEFERRED)


def acquire_sandbox(opened: Opened, settings: Settings, app: Any,
                    past_permit: Callable[[], None] | None = None) -> Acquired:
    """Raises FenceLostError when the attempt lost its fence on the way.

    `past_permit` is called once the start permit is decided (the fair relay's window)."""
    claimed, policy = opened.claimed, opened.policy
    fence = claimed.fence
    provider: SandboxProvider = provider_for()
    if policy.mode == traffic.HOLD:
        defer(fence, "hold", settings, app, detail="hold_new_sandbox_starts is in force")
        return _DEFERRED
    # Capacity first: a run that waits for its org's capacity burns no start permit.
    if opened.full is not None:
        exc = opened.full
        if settings.capacity_full == "defer":
            defer(fence, "capacity", settings, app, detail=exc.message)
            return _DEFERRED
        return Acquired(Step.FAILED, code=exc.code, error=f"{exc.code}: {exc.message}",
                        reason="capacity")
    lease_id = opened.lease_id
    assert lease_id is not None  # open_attempt reserved it: not held, not full
    decision = permits.acquire(provider.name, policy, settings)
    if past_permit is not None:
        past_permit()
    if decision.granted:
        metrics.start(claimed.org_id)
    else:
        defer(fence, "throttle", settings, app, at_least_ms=decision.wait_ms,
              detail=f"start rate {decision.rate:g}/min")
        return _DEFERRED
    try:
        ref = create(provider, claimed, settings, lease_id)
    except ProviderError as exc:
        cause = _PROVIDER_CAUSE.get(exc.kind)
        if cause is None:
            return Acquired(Step.FAILED, code=SANDBOX_START_FAILED, error=str(exc),
                            reason="start_failed")
        if cause != "transport":
            permits.penalize(provider.name, policy, decision.epoch, settings)
        defer(fence, cause, settings, app, detail=str(exc)[:200])  # type: ignore[arg-type]
        return _DEFERRED
    permits.accepted(provider.name)  # the adaptive rate grows on real starts only
    # The launch records the sandbox live and promotes the lease, in its own transaction.
    return Acquired(Step.LIVE, ref=ref, lease_id=lease_id)
