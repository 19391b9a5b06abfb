"""Launch the runner detached, after recording the launch under the fence.

The launch is recorded *before* exec: if the worker dies in between, the reaper
treats the attempt as launched and inspects it, so a play can never run twice; a
sandbox in which no process was ever started is the one case tried again.

From here the runner is on its own: it heartbeats and pushes through the gateway
with the tokens minted here, and the worker slot is free at once.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import Attempt, Run, db_now
from tasks.acquisition import capacity
from tasks.acquisition.pools.claim import Claim, claim_in, wake
from tasks.acquisition.pools.config import Pool
from tasks.acquisition.sandbox import record_for_cleanup, record_live_in
from tasks.constants import LABEL_MEMBER, LABEL_POOL, RUNNER_FILE, EventKind
from tasks.errors import FenceLostError
from tasks.execution import launch_record
from tasks.observe import metrics
from tasks.sandbox import ExitReport, ExitReporting, ProviderError, SandboxProvider, SandboxRef
from tasks.sandbox.runtime import host_queue
from tasks.security import tokens
from tasks.settings import Settings
from tasks.store import ledger
from tasks.store.db import after_commit, driver_cursor, session_scope
from tasks.store.fence import Fence, hold

# The supervisor's hard kill comes this long after the runner's own timeout fires.
HARD_KILL_GRACE_S = 5.0
# A new runner's first lease covers its start-up as well as one heartbeat timeout.
STARTUP_GRACE_S = 10.0
# Tokens outlive the run's time limit by the runner's final flush and push (runner.py).
TOKEN_MARGIN_S = 120.0


class Launch(enum.Enum):
    LAUNCHED = "launched"
    CANCELLED = "cancelled"  # a cancel arrived before exec: nothing ran
    VANISHED = "vanished"  # the sandbox was gone before exec: nothing ran, retry is safe
    NO_ROOM = "no_room"  # no space to exec (a disk filled after create): nothing ran
    AMBIGUOUS = "ambiguous"  # exec's answer was lost: the runner may be running
    FAILED = "failed"  # the provider refused the exec


@dataclass(frozen=True)
class Launched:
    step: Launch
    launch_id: str | None = None
    error: str = ""


@dataclass(frozen=True)
class LaunchMark:
    launch_id: str
    db_time: float  # epoch seconds by the database clock: the tokens' issue time


def mark_launching(fence: Fence, settings: Settings) -> str | None:
    """Fenced: record the launch, its deadline and its first lease; None if cancelled."""
    mark = record_launch(fence, settings)
    return mark.launch_id if mark is not None else None


def record_launch(fence: Fence, settings: Settings, sandbox: SandboxRef | None = None,
                  lease_id: str | None = None) -> LaunchMark | None:
    """mark_launching, also reading the database clock (a worker's clock minutes off must
    not mint tokens the gateway thinks not yet valid, or expired). With `sandbox`, the same
    transaction first records it live and promotes its capacity lease `lease_id`."""
    launch_id = secrets.token_hex(16)
    if sandbox is not None and settings.is_postgres and settings.provider_max_live is None:
        done, mark = _record_fast(fence, settings, sandbox, lease_id, launch_id)
        if done:
            return mark

    try:
        with session_scope() as session:
            if sandbox is not None:
                run, attempt = record_live_in(session, fence, sandbox,
                                              _promoter(fence, lease_id, settings))
            else:
                run, attempt = hold(session, fence)
            if run.cancel_requested_at is not None:
                return None  # committed: the sandbox is on record, so the release deletes it
            return _mark(session, run, attempt, launch_id, settings)
    except FenceLostError:
        if sandbox is not None:
            record_for_cleanup(fence, sandbox, "reported after the attempt lost its fence")
        raise


def _promoter(fence: Fence, lease_id: str | None,
              settings: Settings) -> Callable[[Session, SandboxRef], None]:
    """Promotes the attempt's capacity lease (and its provider slot) to the sandbox."""
    def promote(session: Session, ref: SandboxRef) -> None:
        if lease_id is not None:
            capacity.promote(session, fence, lease_id, ref.provider, ref.sandbox_id)
            if settings.provider_max_live is not None:
                capacity.promote_pool(session, fence, ref.provider, ref.sandbox_id)
    return promote


def launch_warm(fence: Fence, pool: Pool, lease_id: str | None,
                settings: Settings) -> tuple[Launch, Claim] | None:
    """Claim a warm sandbox of `pool` and record it live and launched, in one durable
    transaction; None when the pool has no ready member (the same transaction records the
    miss, and the attempt starts cold). Its standby runner takes the assignment from the
    gateway: there is no exec to lose."""
    launch_id = secrets.token_hex(16)
    # Not durable: the standby's delivery (a durable commit) flushes it before any play
    # code runs, and a crash that loses it loses the claim with it (the member stays ready).
    with session_scope(durable=False) as session:
        held = hold(session, fence)  # the run row first, as every writer locks: then the member
        claim = claim_in(session, pool, fence)
        if claim is None:
            ledger.append(session, fence.run_id, EventKind.POOL_MISSED, {"pool": pool.name},
                          fence.generation)
            return None
        ref = SandboxRef(claim.provider, claim.sandbox_id,
                         {LABEL_POOL: claim.pool, LABEL_MEMBER: claim.member_id},
                         claim.created_at)
        run, attempt = record_live_in(session, fence, ref, _promoter(fence, lease_id, settings),
                                      held)
        ledger.append(session, fence.run_id, EventKind.POOL_CLAIMED,
                      {"pool": claim.pool, "sandbox_id": claim.sandbox_id}, fence.generation)
        if run.cancel_requested_at is not None:
            return Launch.CANCELLED, claim  # on record: the release deletes the sandbox
        _mark(session, run, attempt, launch_id, settings)
    wake(claim.member_id)
    return Launch.LAUNCHED, claim


def _record_fast(fence: Fence, settings: Settings, sandbox: SandboxRef, lease_id: str | None,
                 launch_id: str) -> tuple[bool, LaunchMark | None]:
    """(False, None) when the statement wrote nothing: the general transaction decides."""
    with driver_cursor() as cur:
        done = launch_record.record(
            cur, fence, sandbox, lease_id, launch_id=launch_id,
            host_queue=host_queue(sandbox.provider), deadline_s=_deadline_s(settings),
            lease_s=_first_lease_s(settings))
    if done.outcome is launch_record.Recorded.MISSED:
        return False, None
    if done.outcome is launch_record.Recorded.CANCELLED:
        return True, None
    if done.created_at is not None:
        metrics.run_started(done.created_at)
    return True, LaunchMark(launch_id, done.db_time)


def _deadline_s(settings: Settings) -> float:
    """Past this the runner is lost whatever the sandbox says."""
    return settings.run_timeout_s + HARD_KILL_GRACE_S + settings.heartbeat_timeout_s


def _first_lease_s(settings: Settings) -> float:
    return settings.heartbeat_timeout_s + STARTUP_GRACE_S


def _mark(session: Session, run: Run, attempt: Attempt, launch_id: str,
          settings: Settings) -> LaunchMark:
    with session.no_autoflush:  # the attempt's changes go out as one UPDATE at commit
        db_time = session.scalar(sa.select(db_now()))
    assert db_time is not None
    attempt.launch_id = launch_id
    attempt.runner_started_at = db_now()
    attempt.runner_deadline = db_now(_deadline_s(settings))
    attempt.lease_expires_at = db_now(_first_lease_s(settings))
    created_at = run.created_at
    after_commit(session, lambda: metrics.run_started(created_at))
    return LaunchMark(launch_id, db_time.timestamp())


def _minter(fence: Fence, org_id: str, launch_id: str, settings: Settings,
            issued_at: float | None) -> Callable[[tuple[str, ...]], str]:
    """Tokens of this launch, by capabilities. issued_at: the database clock."""
    ttl = settings.run_timeout_s + settings.heartbeat_timeout_s + TOKEN_MARGIN_S

    def mint(capabilities: tuple[str, ...]) -> str:
        return tokens.mint(org_id=org_id, run_id=fence.run_id, generation=fence.generation,
                           launch_id=launch_id, capabilities=capabilities, ttl_s=ttl,
                           secret=settings.secret_key, issued_at=issued_at)

    return mint


def runner_env(fence: Fence, org_id: str, launch_id: str, settings: Settings,
               issued_at: float | None = None, provider: str | None = None) -> dict[str, str]:
    """What the runner is told: its scope, its tokens and where the gateway is; never a
    database or Redis URL. issued_at: the database clock (LaunchMark.db_time)."""
    mint = _minter(fence, org_id, launch_id, settings, issued_at)
    return {
        "PLAYRUN_RUN_ID": fence.run_id,
        "PLAYRUN_GENERATION": str(fence.generation),
        "PLAYRUN_ORG_ID": org_id,
        "PLAYRUN_LAUNCH_ID": launch_id,
        "PLAYRUN_GATEWAY_URL": settings.runner_gateway_url(provider),
        # The socket exists only on this host: a remote sandbox has the URL alone.
        "PLAYRUN_GATEWAY_SOCKET": str(settings.gateway_socket)
        if (provider or settings.sandbox_provider) in ("local", "fake") else "",
        "PLAYRUN_HEARTBEAT_S": f"{settings.heartbeat_interval_s:g}",
        "PLAYRUN_TOKEN": mint(tokens.RUNNER_CAPABILITIES),
        "PLAYRUN_PROJECTION_TOKEN": mint(tokens.PROJECTION_CAPABILITIES),
        "PLAYRUN_SHEET_PAGE_ROWS": str(settings.sheet_page_rows),
        "PLAYRUN_SHEET_WRITE_ROWS": str(settings.sheet_write_rows),
    }


def launch(fence: Fence, provider: SandboxProvider, sandbox: SandboxRef, lease_id: str | None,
           org_id: str, settings: Settings) -> Launched:
    """Record the sandbox live and the launch (one durable transaction), then exec."""
    sandbox_id = sandbox.sandbox_id
    mark = record_launch(fence, settings, sandbox, lease_id)
    if mark is None:
        return Launched(Launch.CANCELLED)
    launch_id = mark.launch_id
    argv = ["{python}", RUNNER_FILE, "--timeout", f"{settings.run_timeout_s:g}"]
    env = runner_env(fence, org_id, launch_id, settings, mark.db_time, provider.name)
    timeout_s = settings.run_timeout_s + HARD_KILL_GRACE_S
    try:
        if settings.exit_report and isinstance(provider, ExitReporting) \
                and provider.reports_exit:
            # The supervisor's own token, outside the runner's env: it can only report the exit.
            token = _minter(fence, org_id, launch_id, settings, mark.db_time)(
                tokens.EXIT_CAPABILITIES)
            report = ExitReport(token, settings.runner_gateway_url(provider.name),
                                env["PLAYRUN_GATEWAY_SOCKET"])
            provider.exec_detached(sandbox_id, argv, env=env, timeout_s=timeout_s,
                                   report=report)
        else:
            provider.exec_detached(sandbox_id, argv, env=env, timeout_s=timeout_s)
    except ProviderError as exc:
        step = {"transport": Launch.AMBIGUOUS, "not_found": Launch.VANISHED,
                "capacity_unavailable": Launch.NO_ROOM}.get(exc.kind, Launch.FAILED)
        return Launched(step, launch_id, str(exc)[:500])
    return Launched(Launch.LAUNCHED, launch_id)
