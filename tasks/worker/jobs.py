"""The Celery tasks: thin shells that walk a run down its life.

start_attempt claims, acquires and launches, then returns: the runner pushes its own
progress and terminal through the gateway. The tasks that touch a sandbox (release,
inspect, cancel) go to the queue of the host that holds it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from celery import Task

from models import Attempt, Run, db_now
from tasks.acquisition import placement
from tasks.acquisition import policy as traffic
from tasks.acquisition.claim import Skip, Skipped, seconds_until_due
from tasks.acquisition.deferral import defer
from tasks.acquisition.fairshare import relay as fair_relay
from tasks.acquisition.pools import claim as pool_claim
from tasks.acquisition.pools import hygiene
from tasks.acquisition.pools import stats as pool_stats
from tasks.acquisition.pools.refill import refill
from tasks.acquisition.start import Opened, Step, acquire_sandbox, open_attempt
from tasks.admission.relay import publish_due, resend_stale
from tasks.broker.app import app, provider_queue
from tasks.constants import (
    RUNTIME_RUNNER_LOST,
    SANDBOX_START_FAILED,
    TASK_CANCEL_ATTEMPT,
    TASK_INSPECT_ATTEMPT,
    TASK_POOL_REFILL,
    TASK_POOL_TICK,
    TASK_PRUNE_HISTORY,
    TASK_REAP,
    TASK_RELEASE_ATTEMPT,
    TASK_RELEASE_ATTEMPTS,
    TASK_SANDBOX_GC,
    TASK_START_ATTEMPT,
    TASK_SWEEP_OUTBOX,
    TASK_WATCHDOG_PING,
    AttemptState,
    EventKind,
    StartOrder,
)
from tasks.errors import FenceLostError
from tasks.execution.inspect import Verdict, inspect
from tasks.execution.launch import Launch, launch, launch_warm
from tasks.maintenance import held
from tasks.maintenance.gc import collect
from tasks.maintenance.reaper import reap
from tasks.maintenance.retention import prune
from tasks.maintenance.trouble import note_failure
from tasks.observe import metrics
from tasks.release.attempt import release_attempt, release_attempts
from tasks.release.finish import finish
from tasks.release.sandboxes import release_sandboxes
from tasks.sandbox import ProviderError
from tasks.sandbox.runtime import provider
from tasks.settings import Settings, get_settings
from tasks.settlement.outcome import CANCELLED_OUTCOME, Outcome
from tasks.settlement.terminal import CANCEL_REASON, settle_forced, settle_unattended
from tasks.store import ledger
from tasks.store.db import session_scope
from tasks.store.fence import Fence, hold

log = logging.getLogger("playrun.jobs")
held.connect()


@app.task(name=TASK_START_ATTEMPT, bind=True, max_retries=None)
def start_attempt(self: Task, run_id: str, routed: str | None = None) -> str:
    """`routed`: the provider the start was placed on (its queue), if any."""
    settings = get_settings()
    if settings.start_order != StartOrder.FAIR:
        return _start(self, run_id, routed, settings, None)
    task_id = str(self.request.id)

    def past_permit() -> None:
        fair_relay.taken(task_id, settings)

    try:
        return _start(self, run_id, routed, settings, past_permit)
    finally:
        past_permit()  # every other way out (a second report changes nothing)


def _start(self: Task, run_id: str, routed: str | None, settings: Settings,
           past_permit: Callable[[], None] | None) -> str:
    placement.renew(settings.served)
    opened = open_attempt(run_id, settings, routed)
    if isinstance(opened, Skipped):
        if opened.reason == Skip.LOCKED:
            raise self.retry(countdown=1)  # another worker holds the run row right now
        if opened.reason == Skip.NOT_DUE:
            # Early by the worker's clock (the DB clock decides): come back when due, or
            # leave it to the sweep if that is further off than any countdown we allow.
            left = seconds_until_due(run_id)
            if left is not None and left <= settings.max_countdown_s:
                raise self.retry(countdown=max(left, 0.0) + 0.05)
        if opened.reason == Skip.CANCEL:
            settle_unattended(run_id, CANCELLED_OUTCOME)
        return opened.reason.value
    claimed = opened.claimed
    fence = claimed.fence
    try:
        warm = _start_warm(opened, settings, routed)
        if warm is not None:
            return warm
        acquired = acquire_sandbox(opened, settings, routed, past_permit)
        if acquired.step == Step.FAILED:
            finish(fence, Outcome.failed(acquired.code, acquired.error), acquired.reason)
        if acquired.step != Step.LIVE or acquired.ref is None:
            return acquired.step.value
        ref = acquired.ref
        launched = launch(fence, provider(ref.provider), ref, acquired.lease_id,
                          claimed.org_id, settings)
    except FenceLostError as exc:
        log.warning("run %s gen %s lost its fence during start: %s", run_id,
                    fence.generation, exc)
        release_attempt(run_id, fence.generation, fence.lease_token)
        return "fence_lost"
    if launched.step == Launch.CANCELLED:
        finish(fence, CANCELLED_OUTCOME, CANCEL_REASON)
    elif launched.step == Launch.VANISHED:
        # The sandbox vanished before exec: no customer code ran, retrying is safe.
        defer(fence, "transport", settings, detail=launched.error[:200])
    elif launched.step == Launch.NO_ROOM:
        # As a create refused for space: the start waits for room instead of failing.
        defer(fence, "provider_capacity", settings, detail=launched.error[:200])
    elif launched.step == Launch.FAILED:
        finish(fence, Outcome.failed(SANDBOX_START_FAILED, launched.error), "start_failed")
    elif launched.step == Launch.AMBIGUOUS:
        # The runner may have started: never retried; its heartbeats or an inspection decide.
        log.warning("launch of run %s unconfirmed (%s)", run_id, launched.error)
    return launched.step.value


def _start_warm(opened: Opened, settings: Settings, routed: str | None) -> str | None:
    """The launch's step when the attempt took a warm sandbox; None when its pool had none
    (the miss is in its ledger) or no pool applies: it starts cold."""
    if (opened.lease_id is None or opened.full is not None or opened.provider_full
            or opened.policy.mode == traffic.HOLD):
        return None
    fence = opened.claimed.fence
    pool = pool_claim.applicable(fence, routed, settings)
    if pool is None:
        return None
    got = launch_warm(fence, pool, opened.lease_id, settings)
    ask_refill(pool.name, pool.provider, pool_claim.host_of(pool.provider))
    if got is None:
        pool_stats.count(pool.name, "misses")
        metrics.pool_claim(pool.name, "missed")
        return None
    step, _claim = got
    pool_stats.count(pool.name, "claims")
    metrics.pool_claim(pool.name, "claimed")
    if step == Launch.CANCELLED:
        finish(fence, CANCELLED_OUTCOME, CANCEL_REASON)
    return step.value


def ask_refill(name: str, provider_name: str, host: str) -> None:
    """One refill task where the pool's sandboxes can be made (dropped if not taken soon)."""
    expires = max(3 * get_settings().pool_tick_s, 5.0)
    queue_name = host or provider_queue(provider_name)
    try:
        pool_refill.apply_async((name, host), queue=queue_name, expires=expires)
    except Exception as exc:  # noqa: BLE001 - beat's next tick asks again
        log.warning("cannot ask for a refill of pool %s: %s", name, exc)


@app.task(name=TASK_POOL_REFILL, ignore_result=True)
def pool_refill(name: str, host: str = "") -> dict[str, Any]:
    """Delete a pool's retired members here, then refill it (tasks/acquisition/pools)."""
    settings = get_settings()
    placement.renew(settings.served)  # a worker that only refills still announces its host
    report = refill(name, settings, host)
    return report.__dict__


@app.task(name=TASK_POOL_TICK)
def pool_tick() -> dict[str, Any]:
    """Beat: retire what pools no longer keep, then ask for each refill where it can run."""
    report = hygiene.tick(get_settings())
    asked = {(name, host) for name, _provider, host in report.refills if host}
    hosts: list[str] | None = None
    for name, provider_name, host in report.refills:
        if provider_name == "local" and not host:
            # Hosts that announced they serve `local` but hold none of its members yet.
            hosts = placement.pool_hosts() if hosts is None else hosts
            for each in hosts:
                if (name, each) not in asked:
                    ask_refill(name, provider_name, each)
        else:
            ask_refill(name, provider_name, host)
    return {"retired": report.retired, "refills": len(report.refills)}


@app.task(name=TASK_RELEASE_ATTEMPT, ignore_result=True)
def release_attempt_task(run_id: str, generation: int, holder_token: str) -> None:
    """After a pushed terminal: the sandbox, the capacity lease (and later receipts)."""
    release_attempt(run_id, generation, holder_token)


@app.task(name=TASK_RELEASE_ATTEMPTS, ignore_result=True)
def release_attempts_task(holders: list[Any]) -> int:
    """release_attempt for each [run_id, generation, token]: the gateway sends one such
    task for the releases of one host queue that settle within a short window."""
    return release_attempts(holders)


def _quiet_attempt(run_id: str, generation: int,
                   token: str) -> tuple[str | None, bool, str | None] | None:
    with session_scope(readonly=True) as session:
        row = session.execute(sa.select(
            Attempt.sandbox_id, Attempt.runner_deadline < db_now(), Attempt.provider,
        ).where(Attempt.run_id == run_id, Attempt.generation == generation,
                Attempt.lease_token == token, Attempt.state == AttemptState.ACTIVE)).first()
    return (row[0], bool(row[1]), row[2]) if row else None


def _keep_running(fence: Fence) -> None:
    """Still running but silent (the gateway was unreachable): give it another timeout."""
    settings = get_settings()
    with session_scope() as session:
        _run, attempt = hold(session, fence)
        if attempt.unreachable_at is None:
            ledger.append(session, fence.run_id, EventKind.RUNNER_UNREACHABLE,
                          {"reason": "heartbeats stopped but the runner is still running"},
                          fence.generation)
        attempt.unreachable_at = db_now()
        attempt.lease_expires_at = db_now(settings.heartbeat_timeout_s)


@app.task(name=TASK_INSPECT_ATTEMPT, ignore_result=True)
def inspect_attempt(run_id: str, generation: int, lease_token: str,
                    reported: bool = False) -> None:
    """A runner whose heartbeats stopped, or whose exit its sandbox's supervisor reported
    (`reported`), on its own host: settle from what it left."""
    found = _quiet_attempt(run_id, generation, lease_token)
    if found is None:
        return  # settled or adopted meanwhile
    sandbox_id, past_deadline, sandbox_provider = found
    fence = Fence(run_id, generation, lease_token)
    try:
        if pool_claim.withdraw(sandbox_provider, sandbox_id):
            # A warm sandbox claimed for it never took the run: nothing ran, try again.
            defer(fence, "worker_lost", get_settings(),
                  detail="its warm sandbox never took the run")
            return
        inspected = inspect(provider(sandbox_provider), sandbox_id,
                            past_deadline=past_deadline, reported=reported)
        if inspected.verdict == Verdict.KEEP:
            if not reported:  # an exit reported of a runner still running: heartbeats decide
                _keep_running(fence)
            return
        if inspected.verdict == Verdict.NEVER_RAN:
            # Its worker died between recording the launch and exec: trying again is safe.
            defer(fence, "worker_lost", get_settings(),
                  detail="the runner was never started")
            return
        outcome = inspected.outcome
        assert outcome is not None
        if outcome.code == RUNTIME_RUNNER_LOST:
            with session_scope() as session:
                hold(session, fence)
                ledger.append(session, run_id, EventKind.RUNNER_LOST, {"reason": outcome.error},
                              generation)
        finish(fence, outcome, "runner_lost")
    except FenceLostError:
        return
    except (ProviderError, sa.exc.SQLAlchemyError) as exc:
        note_failure(run_id, exc, "the lost-runner inspection")


@app.task(name=TASK_CANCEL_ATTEMPT, ignore_result=True)
def cancel_attempt(run_id: str) -> None:
    """Delete the sandbox, then write `cancelled` unless a terminal already won."""
    with session_scope(readonly=True) as session:
        row = session.execute(sa.select(Attempt.generation, Attempt.lease_token).join(
            Run, Run.id == Attempt.run_id).where(
            Attempt.run_id == run_id, Attempt.generation == Run.current_generation,
            Attempt.state == AttemptState.ACTIVE)).first()
    if row is None:
        settle_unattended(run_id, CANCELLED_OUTCOME)
        return
    generation, token = row
    release_sandboxes(run_id, generation, token)
    settle_forced(run_id, CANCELLED_OUTCOME, CANCEL_REASON)
    release_attempt(run_id, generation, token)


@app.task(name=TASK_WATCHDOG_PING, ignore_result=True)
def watchdog_ping() -> None:
    """Received is what counts (see tasks.worker.watchdog); running it is a no-op."""


@app.task(name=TASK_SWEEP_OUTBOX)
def sweep_outbox() -> int:
    settings = get_settings()
    if settings.start_order == StartOrder.FAIR:
        return (publish_due(without_org=True)
                + resend_stale(after_s=settings.outbox_resend_after_s, requeue=True)
                + fair_relay.pump(settings))
    return publish_due() + resend_stale(after_s=settings.outbox_resend_after_s)


@app.task(name=TASK_REAP)
def reap_attempts() -> dict[str, Any]:
    report = reap(get_settings())
    return report.__dict__


@app.task(name=TASK_SANDBOX_GC)
def sandbox_gc() -> dict[str, Any]:
    settings = get_settings()
    report = collect([provider(name) for name in settings.served], settings.gc_grace_s,
                     fleet=settings.fleet)
    return report.__dict__


@app.task(name=TASK_PRUNE_HISTORY)
def prune_history() -> dict[str, Any]:
    """Beat's retention pass: a bounded number of batches; the next pass goes on."""
    settings = get_settings()
    if settings.retention_days == 0:
        return {"deleted": {}, "batches": 0, "complete": True}
    report = prune(settings.retention_days * 86400.0, batch=settings.retention_batch,
                   max_batches=settings.retention_batches_per_pass)
    return {"deleted": {t: n for t, n in report.deleted.items() if n},
            "batches": len(report.batch_ms), "complete": report.complete}
