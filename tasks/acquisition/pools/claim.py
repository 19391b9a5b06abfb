"""Which pool an attempt may claim from, and the claim itself: one statement that hands the
oldest ready member of the pool (on this host, for a host-bound provider) to one attempt.

The claim runs inside the launch's transaction (tasks/execution/launch.py), after the fence
is held: the member, the sandbox's live record, the capacity lease's promotion and the
launch record commit together or not at all, so no worker death between them can hand a
sandbox out twice or leave one claimed by nobody. On PostgreSQL concurrent claimers skip
each other's locked rows (FOR UPDATE SKIP LOCKED); SQLite has one writer at a time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import Attempt, PoolMember, Run, db_now
from tasks.acquisition.pools.config import Pool, pools
from tasks.admission.placement import first_provider, policy_named
from tasks.constants import DEFAULT_POOL, KEY_POOL_ASSIGNED, PoolMemberState
from tasks.sandbox.runtime import host_queue
from tasks.settings import Settings
from tasks.store.db import is_postgres, session_scope
from tasks.store.fence import Fence
from tasks.store.notify import redis_client

# Pools are read at most this often per process: a start with no pool costs no query.
_CACHE_S = 2.0


@dataclass(frozen=True)
class Claim:
    member_id: str
    pool: str
    provider: str
    sandbox_id: str
    created_at: float


class _Pools:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = -_CACHE_S
        self._pools: dict[str, Pool] = {}

    def get(self) -> dict[str, Pool]:
        with self._lock:
            if time.monotonic() - self._at >= _CACHE_S:
                self._pools = {p.name: p for p in pools()}
                self._at = time.monotonic()
            return self._pools

    def clear(self) -> None:
        with self._lock:
            self._at = -_CACHE_S


cache = _Pools()


def host_of(provider: str) -> str:
    """'' for a provider any worker reaches; this host's queue for `local`."""
    return host_queue(provider) or ""


def applicable(fence: Fence, routed: str | None, settings: Settings) -> Pool | None:
    """The pool this attempt may claim from: its policy's (when the policy picked its
    primary provider) or `default` for a run with no policy; None when there is none, or
    this worker does not serve its provider."""
    known = cache.get()
    if not known:
        return None
    with session_scope(readonly=True) as session:
        row = session.execute(sa.select(Run.placement, Attempt.placed_provider).join(
            Attempt, Attempt.run_id == Run.id).where(
            Run.id == fence.run_id, Attempt.generation == fence.generation)).first()
    if row is None:
        return None
    name, placed = row
    if name is None:
        pool = known.get(DEFAULT_POOL)
        own = routed if routed in settings.served else settings.primary_provider
        return pool if pool is not None and pool.provider == own else None
    pool = known.get(name)
    if pool is None or pool.provider not in settings.served:
        return None
    policy = policy_named(name)
    # A canary pick, or an attempt already failed over, starts cold where it was placed.
    if policy is None or first_provider(policy, fence.run_id) != pool.provider:
        return None
    if (placed or routed) not in (None, pool.provider):
        return None
    return pool


def claim_in(session: Session, pool: Pool, fence: Fence) -> Claim | None:
    """Inside the caller's transaction (fence held): the oldest ready, unexpired member of
    `pool` on this host is the attempt's; None when there is none."""
    pick = sa.select(PoolMember.id).where(
        PoolMember.pool == pool.name, PoolMember.host == host_of(pool.provider),
        PoolMember.state == PoolMemberState.READY, PoolMember.expires_at > db_now(),
    ).order_by(PoolMember.ready_at).limit(1)
    if is_postgres(session):
        pick = pick.with_for_update(skip_locked=True)
    row = session.execute(sa.update(PoolMember).where(
        PoolMember.id == pick.scalar_subquery(), PoolMember.state == PoolMemberState.READY,
    ).values(state=PoolMemberState.CLAIMED, run_id=fence.run_id, generation=fence.generation,
             claimed_at=db_now()).returning(
        PoolMember.id, PoolMember.provider, PoolMember.sandbox_id, PoolMember.created_at,
    ).execution_options(synchronize_session=False)).first()
    if row is None or row[2] is None:
        return None
    return Claim(row[0], pool.name, row[1], row[2], row[3].timestamp())


def wake(member_id: str) -> None:
    """Tell the gateway a standby runner's assignment is ready (it also looks on its own,
    every PLAYRUN_POOL_STANDBY_WAIT_S, so a lost message only slows one start)."""
    try:
        redis_client().publish(KEY_POOL_ASSIGNED, member_id)
    except redis.RedisError:
        return


def withdraw(provider: str | None, sandbox_id: str | None) -> bool:
    """A warm claim whose standby never took the run (the play never ran): take it back,
    so the standby can no longer take it, and say so; False for anything else. The row
    lock orders this against the gateway's delivery (actions/standby.py)."""
    if not provider or not sandbox_id or not cache.get():
        return False
    with session_scope() as session:
        done = session.execute(sa.update(PoolMember).where(
            PoolMember.provider == provider, PoolMember.sandbox_id == sandbox_id,
            PoolMember.state == PoolMemberState.CLAIMED, PoolMember.delivered_at.is_(None),
        ).values(state=PoolMemberState.GONE, last_error="its standby never took the run")
            .execution_options(synchronize_session=False))
        return bool(done.rowcount)  # type: ignore[attr-defined]
