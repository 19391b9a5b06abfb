"""A pool's refill, on a worker that serves its provider (and, for `local`, on the host the
members live on): delete what hygiene retired, then start members up to the pool's minimum.

Each refill is a start like any other: it takes a permit from the provider's start-rate
bucket (only a slot free now, so runs that reserved slots keep them; and none while runs
were deferred for the rate lately), counts against PLAYRUN_PROVIDER_MAX_LIVE, and a
provider's pushback cuts the shared rate. A failed create backs the pool off, doubling up
to PLAYRUN_POOL_REFILL_BACKOFF_MAX_S, and never touches members that are ready.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
import sqlalchemy as sa

from models import CapacityLease, PoolMember, db_now
from tasks.acquisition import capacity, permits
from tasks.acquisition import policy as traffic
from tasks.acquisition.pools import stats
from tasks.acquisition.pools.claim import host_of
from tasks.acquisition.pools.config import Pool, pool_named
from tasks.acquisition.sandbox import LIFETIME_GRACE_S, egress_for, runner_files
from tasks.constants import (
    KEY_POOL_BACKOFF,
    KEY_POOL_REFILL,
    LABEL_FLEET,
    LABEL_MANAGED,
    LABEL_MEMBER,
    LABEL_POOL,
    LeaseState,
    PoolMemberState,
)
from tasks.observe import metrics
from tasks.protocol import RUNNER_FILE
from tasks.sandbox import ProviderError, SandboxProvider, SandboxSpec
from tasks.sandbox.runtime import provider as provider_for
from tasks.security import tokens
from tasks.settings import Settings
from tasks.store.db import session_scope
from tasks.store.notify import redis_client

log = logging.getLogger("playrun.pools")

# The supervisor's hard kill comes this long after the standby's whole life (as a launch's).
STANDBY_GRACE_S = 5.0
# One refill task per pool and host at a time; a dead one's lock lapses after this (each
# start renews it, so a slow provider's creates keep it).
LOCK_MS = 30_000
# One task starts at most this many, for at most this long (well inside its lock).
MAX_STARTS = 16
MAX_WORK_S = 60.0
# A refill waits for a free start slot at most this long (runs reserve theirs ahead).
WAIT_MAX_MS = 2000
_LIVE = (LeaseState.RESERVED, LeaseState.LIVE)
_KEPT = (PoolMemberState.CREATING, PoolMemberState.READY)


@dataclass
class RefillReport:
    pool: str
    started: int = 0
    deleted: int = 0
    stopped: str = ""  # why it started no more (full, rate, backoff, error, ...)
    errors: list[str] = field(default_factory=list)


def _key(pool: str, host: str) -> str:
    return f"{pool}:{host}"


def refill(name: str, settings: Settings, host: str | None = None) -> RefillReport:
    """Delete retired members of pool `name` here, then refill it to its minimum."""
    pool = pool_named(name)
    report = RefillReport(name)
    provider_name = pool.provider if pool is not None else None
    if provider_name is None or provider_name not in settings.served:
        # A removed pool's members: whichever of this worker's providers made them.
        for served in settings.served:
            report.deleted += delete_retired(name, provider_for(served), host_of(served))
        report.stopped = "no such pool" if pool is None else "provider not served here"
        return report
    assert pool is not None
    here = host_of(pool.provider) if host is None else host
    if here != host_of(pool.provider):
        report.stopped = "another host's pool"
        return report
    client = redis_client()
    lock = KEY_POOL_REFILL + _key(name, here)
    try:
        if not client.set(lock, "1", nx=True, px=LOCK_MS):
            report.stopped = "another refill runs"
            return report
    except redis.RedisError:
        report.stopped = "no redis"
        return report
    try:
        provider = provider_for(pool.provider)
        _orphans(name, here)
        report.deleted = delete_retired(name, provider, here)
        _start_members(pool, provider, here, settings, report,
                       lambda: client.pexpire(lock, LOCK_MS))
    finally:
        with contextlib.suppress(redis.RedisError):
            client.delete(lock)
    return report


def _start_members(pool: Pool, provider: SandboxProvider, host: str, settings: Settings,
                   report: RefillReport, renew: Callable[[], object]) -> None:
    if _backing_off(pool.name, host):
        report.stopped = "backing off after errors"
        return
    need = min(pool.min_ready - _kept(pool.name, host), MAX_STARTS)
    policy = None
    until = time.monotonic() + MAX_WORK_S
    for _ in range(max(0, need)):
        if time.monotonic() > until:
            report.stopped = "this task's time is up"
            return
        if stats.runs_waiting(pool.provider):
            report.stopped = "runs wait for the start rate"
            return
        if not _room(pool.provider, settings):
            report.stopped = "PLAYRUN_PROVIDER_MAX_LIVE reached"
            return
        if policy is None:
            with session_scope(readonly=True) as session:
                policy = traffic.current(session)
            if policy.mode == traffic.HOLD:
                report.stopped = "starts are held"
                return
        renew()
        published = getattr(provider, "create_rate_per_min", None)
        decision = permits.acquire_now(pool.provider, policy, settings, published)
        while not decision.granted:
            # The next free slot, if it comes soon and no run has reserved it meanwhile.
            if decision.wait_ms > WAIT_MAX_MS or time.monotonic() > until:
                report.stopped = "no start permit free soon"
                return
            time.sleep(max(decision.wait_ms, 1) / 1000)
            if stats.runs_waiting(pool.provider):
                report.stopped = "runs wait for the start rate"
                return
            decision = permits.acquire_now(pool.provider, policy, settings, published)
        error = _start_one(pool, provider, host, settings)
        if error is not None:
            if error.kind in ("rate_limited", "capacity_unavailable"):
                permits.penalize(pool.provider, policy, decision.epoch, settings, published,
                                 retry_after_s=error.retry_after_s,
                                 refused_rate=decision.rate
                                 if error.kind == "rate_limited" else None)
            report.errors.append(f"{error.code}: {str(error)[:200]}")
            report.stopped = "create failed"
            _back_off(pool.name, host, settings)
            stats.count(pool.name, "refill_errors")
            return
        permits.accepted(pool.provider)
        report.started += 1
        stats.count(pool.name, "refills")
    _clear_backoff(pool.name, host)


def _orphans(name: str, host: str) -> None:
    """Members left `creating` by a refill that died: only a refill (holding the lock, as
    this one does) creates, so none of them is still being made."""
    with session_scope() as session:
        session.execute(sa.update(PoolMember).where(
            PoolMember.pool == name, PoolMember.host == host,
            PoolMember.state == PoolMemberState.CREATING,
        ).values(state=PoolMemberState.RETIRING, last_error="its refill stopped midway"))


def _kept(name: str, host: str) -> int:
    with session_scope(readonly=True) as session:
        return int(session.scalar(sa.select(sa.func.count()).select_from(PoolMember).where(
            PoolMember.pool == name, PoolMember.host == host,
            PoolMember.state.in_(_KEPT))) or 0)


def warm_count(provider: str) -> int:
    """Warm sandboxes of `provider` not yet claimed (they count against its live bound)."""
    with session_scope(readonly=True) as session:
        return int(session.scalar(sa.select(sa.func.count()).select_from(PoolMember).where(
            PoolMember.provider == provider, PoolMember.state.in_(_KEPT))) or 0)


def _room(provider: str, settings: Settings) -> bool:
    if settings.provider_max_live is None:
        return True
    with session_scope(readonly=True) as session:
        held = int(session.scalar(sa.select(sa.func.count()).select_from(CapacityLease).where(
            CapacityLease.org_id == capacity.pool_for(provider),
            CapacityLease.state.in_(_LIVE))) or 0)
    return held + warm_count(provider) < settings.provider_max_live


def standby_spec(pool: Pool, member_id: str, settings: Settings) -> SandboxSpec:
    return SandboxSpec(
        key=f"pm-{member_id}",
        lifetime_s=pool.ttl_s + settings.run_timeout_s + LIFETIME_GRACE_S,
        egress_hosts=egress_for(settings),
        labels={LABEL_MANAGED: "1", LABEL_POOL: pool.name, LABEL_MEMBER: member_id,
                LABEL_FLEET: settings.fleet},
        files=runner_files(),
        memory_mb=settings.sandbox_memory_mb,
        max_file_mb=settings.sandbox_max_file_mb,
    )


def standby_env(pool: Pool, member_id: str, provider: str, settings: Settings) -> dict[str, str]:
    """What a standby runner is told: where the gateway is and a token that can only ask
    for its assignment (the run's own tokens come with the assignment)."""
    token = tokens.mint(org_id="", run_id=member_id, generation=0, launch_id=member_id,
                        capabilities=tokens.STANDBY_CAPABILITIES,
                        ttl_s=pool.ttl_s + settings.run_timeout_s, secret=settings.secret_key)
    return {
        "PLAYRUN_GATEWAY_URL": settings.runner_gateway_url(provider),
        "PLAYRUN_GATEWAY_SOCKET": str(settings.gateway_socket)
        if provider in ("local", "fake") else "",
        "PLAYRUN_STANDBY_TOKEN": token,
    }


def _start_one(pool: Pool, provider: SandboxProvider, host: str,
               settings: Settings) -> ProviderError | None:
    """Create one member and start its standby runner; the error if the provider refused."""
    with session_scope(durable=False) as session:
        member = PoolMember(pool=pool.name, provider=pool.provider, host=host,
                            state=PoolMemberState.CREATING)
        session.add(member)
        session.flush()
        member_id = member.id
    sandbox_id: str | None = None
    try:
        ref = provider.create(standby_spec(pool, member_id, settings))
        sandbox_id = ref.sandbox_id
        metrics.provider_create(provider.name, "ok")
        life = pool.ttl_s + settings.run_timeout_s
        provider.exec_detached(
            sandbox_id, ["{python}", RUNNER_FILE, "--standby", "--timeout", f"{life:g}"],
            env=standby_env(pool, member_id, provider.name, settings),
            timeout_s=life + STANDBY_GRACE_S)
    except ProviderError as exc:
        metrics.provider_create(provider.name, exc.kind)
        _retire(member_id, sandbox_id, f"{exc.code}: {str(exc)[:300]}")
        return exc
    with session_scope() as session:
        done = session.execute(sa.update(PoolMember).where(
            PoolMember.id == member_id, PoolMember.state == PoolMemberState.CREATING,
        ).values(state=PoolMemberState.READY, sandbox_id=sandbox_id, ready_at=db_now(),
                 seen_at=db_now(), expires_at=db_now(pool.ttl_s)))
        # Retired meanwhile (its pool removed): the next pass deletes it.
        if not done.rowcount:  # type: ignore[attr-defined]
            session.execute(sa.update(PoolMember).where(PoolMember.id == member_id)
                            .values(sandbox_id=sandbox_id))
    return None


def _retire(member_id: str, sandbox_id: str | None, why: str) -> None:
    with session_scope() as session:
        session.execute(sa.update(PoolMember).where(PoolMember.id == member_id).values(
            state=PoolMemberState.RETIRING, sandbox_id=sandbox_id, last_error=why))


def delete_retired(name: str, provider: SandboxProvider, host: str) -> int:
    """Delete the retired members of pool `name` here (found by label when a crash lost the
    sandbox id); a member is gone once its sandbox is."""
    with session_scope(readonly=True) as session:
        rows = session.execute(sa.select(PoolMember.id, PoolMember.sandbox_id).where(
            PoolMember.pool == name, PoolMember.provider == provider.name,
            PoolMember.host == host, PoolMember.state == PoolMemberState.RETIRING,
        ).limit(100)).all()
    deleted = 0
    for member_id, sandbox_id in rows:
        try:
            ids = [sandbox_id] if sandbox_id else [
                r.sandbox_id for r in provider.list({LABEL_MEMBER: member_id})]
            for one in ids:
                with contextlib.suppress(ProviderError):
                    provider.delete(one)
        except ProviderError as exc:
            log.warning("cannot delete warm sandbox of member %s: %s", member_id, exc)
            continue
        with session_scope(durable=False) as session:
            session.execute(sa.update(PoolMember).where(
                PoolMember.id == member_id, PoolMember.state == PoolMemberState.RETIRING,
            ).values(state=PoolMemberState.GONE))
        deleted += 1
    return deleted


def _backing_off(name: str, host: str) -> bool:
    try:
        return bool(redis_client().exists(KEY_POOL_BACKOFF + _key(name, host)))
    except redis.RedisError:
        return True


def _back_off(name: str, host: str, settings: Settings) -> None:
    key = KEY_POOL_BACKOFF + _key(name, host)
    with contextlib.suppress(redis.RedisError):
        client = redis_client()
        fails = int(client.incr(key + ":fails"))  # type: ignore[arg-type]
        client.expire(key + ":fails", 3600)
        delay = min(settings.pool_tick_s * 2 ** (fails - 1), settings.pool_refill_backoff_max_s)
        client.set(key, "1", px=max(1, int(delay * 1000)))


def _clear_backoff(name: str, host: str) -> None:
    with contextlib.suppress(redis.RedisError):
        redis_client().delete(KEY_POOL_BACKOFF + _key(name, host) + ":fails")


__all__ = ["RefillReport", "delete_retired", "refill", "warm_count"]
