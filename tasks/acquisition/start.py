"""start_attempt, before any customer code runs: claim, policy, permit, capacity, sandbox.

Every failure here is pre-code: hold, throttle and provider pushback defer the
attempt (bounded); a full org is a terminal SANDBOX_CAPACITY_EXCEEDED; auth and
unknown provider errors fail the run with SANDBOX_START_FAILED.
"""

from __future__ import annotations

import logging
from typing import Any

from tasks.acquisition import capacity, permits
from tasks.acquisition import policy as traffic
from tasks.acquisition.claim import Claimed, Skipped, claim
from tasks.acquisition.deferral import defer
from tasks.acquisition.sandbox import create, record_live
from tasks.constants import SANDBOX_START_FAILED
from tasks.db import session_scope
from tasks.errors import CapacityExceededError, FenceLostError
from tasks.execution.launch import launch, mark_launching
from tasks.execution.watch import finish
from tasks.fence import hold, renew
from tasks.release.attempt import release_attempt
from tasks.runtime import provider as provider_for
from tasks.runtime import worker_id
from tasks.sandbox import ProviderError, SandboxProvider, SandboxRef
from tasks.settings import Settings
from tasks.settlement.outcome import CANCELLED_OUTCOME, Outcome
from tasks.settlement.terminal import settle_unattended

log = logging.getLogger("playrun.start")

_PROVIDER_CAUSE = {
    "capacity_unavailable": "provider_capacity",
    "rate_limited": "provider_rate_limited",
    "transport": "transport",
}


def open_attempt(run_id: str, settings: Settings) -> Claimed | Skipped:
    with session_scope() as session:
        result = claim(session, run_id, worker_id=worker_id(), lease_seconds=settings.lease_seconds)
    if isinstance(result, Skipped) and result.reason == "cancel":
        settle_unattended(run_id, CANCELLED_OUTCOME)
    return result


def _policy(claimed: Claimed, settings: Settings) -> traffic.Policy:
    with session_scope() as session:
        hold(session, claimed.fence)
        renew(session, claimed.fence, settings.lease_seconds)
        return traffic.current(session)


def _reserve(claimed: Claimed, settings: Settings) -> str:
    with session_scope() as session:
        hold(session, claimed.fence)
        renew(session, claimed.fence, settings.lease_seconds)
        return capacity.reserve(session, claimed.fence, claimed.org_id, settings).lease_id


def acquire_sandbox(claimed: Claimed, settings: Settings, app: Any) -> SandboxRef | None:
    """Returns the live sandbox, or None when the attempt was deferred or settled."""
    fence = claimed.fence
    provider: SandboxProvider = provider_for()
    policy = _policy(claimed, settings)
    if policy.mode == traffic.HOLD:
        defer(fence, "hold", settings, app, detail="hold_new_sandbox_starts is in force")
        return None
    decision = permits.acquire(provider.name, policy, settings)
    if not decision.granted:
        defer(fence, "throttle", settings, app, at_least_ms=decision.wait_ms,
              detail=f"start rate {decision.rate:g}/min")
        return None
    try:
        lease_id = _reserve(claimed, settings)
    except CapacityExceededError as exc:
        if settings.capacity_full == "defer":
            defer(fence, "capacity", settings, app, detail=exc.message)
        else:
            finish(fence, Outcome.failed(exc.code, f"{exc.code}: {exc.message}"), "capacity")
        return None
    try:
        ref = create(provider, claimed, settings, lease_id)
    except ProviderError as exc:
        cause = _PROVIDER_CAUSE.get(exc.kind)
        if cause is None:
            finish(fence, Outcome.failed(SANDBOX_START_FAILED, str(exc)), "start_failed")
            return None
        if cause != "transport":
            permits.penalize(provider.name, policy, decision.epoch, settings)
        defer(fence, cause, settings, app, detail=str(exc)[:200])  # type: ignore[arg-type]
        return None

    def promote(session: Any, sandbox: SandboxRef) -> None:
        capacity.promote(session, fence, lease_id, sandbox.provider, sandbox.sandbox_id)

    record_live(fence, ref, promote)
    return ref


def start(run_id: str, settings: Settings, app: Any) -> str:
    """The body of start_attempt; returns what happened, for logs and tests."""
    opened = open_attempt(run_id, settings)
    if isinstance(opened, Skipped):
        return opened.reason
    fence = opened.fence
    try:
        ref = acquire_sandbox(opened, settings, app)
        if ref is None:
            return "deferred_or_settled"
        if mark_launching(fence, settings) == "cancelled":
            finish(fence, CANCELLED_OUTCOME, "cancelled")
            return "deferred_or_settled"
        try:
            launch(fence, provider_for(ref.provider), ref.sandbox_id, opened.org_id, settings)
        except ProviderError as exc:
            if exc.kind == "transport":
                # Ambiguous: the runner may have started. Never retry it; the watcher
                # settles from the sandbox, or reports the runner lost.
                log.warning("launch of run %s unconfirmed (%s); watching", run_id, exc)
                return "launched"
            if exc.kind == "not_found":
                # The sandbox vanished before exec: no customer code ran, retrying is safe.
                defer(fence, "transport", settings, app, detail=str(exc)[:200])
            else:
                finish(fence, Outcome.failed(SANDBOX_START_FAILED, str(exc)), "start_failed")
            return "deferred_or_settled"
    except FenceLostError as exc:
        log.warning("run %s gen %s lost its fence during start: %s", run_id,
                    fence.generation, exc)
        release_attempt(run_id, fence.generation, fence.lease_token)
        return "fence_lost"
    return "launched"
