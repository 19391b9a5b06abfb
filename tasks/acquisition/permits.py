"""Start permits from the fleet-wide bucket, honouring the traffic policy.

A wait within the local horizon is slept in place (monotonic clock); a longer
one is returned so the caller defers the attempt durably.

The adaptive rate grows only on starts that happened: `accepted` records a create the
provider accepted, and this process's next acquire on that provider carries the count
as its observed successes (no extra Redis call). A permit whose run then waited for
capacity, or whose create was pushed back, earns nothing.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace
from functools import lru_cache

from redis.backoff import NoBackoff
from redis.retry import Retry

from tasks.acquisition import ceiling, starthistory
from tasks.acquisition.policy import THROTTLE, Policy
from tasks.acquisition.startrate import Permit, RateRule, StartRateLimiter, rules_for
from tasks.constants import START_RATE_TIMEOUT_S
from tasks.observe import metrics
from tasks.settings import Settings, get_settings
from tasks.store import redisconn
from tasks.store.notify import redis_client


@dataclass(frozen=True)
class PermitDecision:
    granted: bool
    wait_ms: int
    epoch: int
    rate: float
    degraded: bool


@lru_cache(maxsize=4)
def _limiter(url: str, pid: int, horizon_ms: int) -> StartRateLimiter:
    if redisconn.parse(url).kind == "cluster":
        # The limiter cannot copy a cluster client's pools: this one never re-sends.
        cluster = redisconn.script_client(
            url, socket_timeout=START_RATE_TIMEOUT_S,
            socket_connect_timeout=START_RATE_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0))
        return StartRateLimiter(cluster, horizon_ms=horizon_ms)
    return StartRateLimiter(redis_client(url), horizon_ms=horizon_ms,
                            socket_timeout_s=START_RATE_TIMEOUT_S)


def limiter() -> StartRateLimiter:
    settings = get_settings()
    url = settings.start_rate_redis_url or settings.redis_url
    return _limiter(url, os.getpid(), settings.start_local_sleep_ms)


_lock = threading.Lock()
_accepted: dict[tuple[int, str], int] = {}  # (pid, provider) -> creates not yet reported


def accepted(provider: str) -> None:
    """The provider accepted a create made under a permit of this process."""
    with _lock:
        key = (os.getpid(), provider)
        _accepted[key] = _accepted.get(key, 0) + 1


def _take(provider: str) -> int:
    with _lock:
        return _accepted.pop((os.getpid(), provider), 0)


def _give_back(provider: str, successes: int) -> None:
    if successes:
        with _lock:
            key = (os.getpid(), provider)
            _accepted[key] = _accepted.get(key, 0) + successes


def _override(policy: Policy) -> float | None:
    return policy.starts_per_minute if policy.mode == THROTTLE else None


def _rules(provider: str, policy: Policy, settings: Settings,
           published_per_min: float | None) -> list[RateRule]:
    """The bucket's rules, the provider rule's max held under a learned ceiling."""
    rules = rules_for(settings, provider, _override(policy), published_per_min)
    cap = ceiling.current(settings.redis_url, provider)
    if cap is None:
        return rules
    rule = rules[0]
    top = max(rule.floor_per_min, min(rule.max_per_min, cap))
    rules[0] = replace(rule, max_per_min=top, initial_per_min=min(rule.initial_per_min, top))
    return rules


def acquire(provider: str, policy: Policy, settings: Settings,
            published_per_min: float | None = None) -> PermitDecision:
    successes = _take(provider)
    rules = _rules(provider, policy, settings, published_per_min)
    permit: Permit = limiter().acquire(provider, rules, observed_successes=successes)
    if not permit.granted or permit.degraded:
        # Only a grant in Redis applies the increase: keep the count for the next one.
        _give_back(provider, successes)
    starthistory.record_permit(provider, permit)  # one pipelined round trip (starthistory.py)
    metrics.permit(provider, permit.granted)
    if permit.granted:
        wait = permit.scheduled_at_ms - permit.server_now_ms
        # The reply is in whole ms (the slot rounded up, the clock down), so an immediate
        # grant reads 1 ms ahead: only a longer wait is a reserved slot worth sleeping for.
        if wait > 1:
            time.sleep(wait / 1000)  # a reserved slot within the horizon: wait for it
    return PermitDecision(permit.granted, permit.wait_ms, permit.epoch, permit.rate,
                          permit.degraded)


def acquire_now(provider: str, policy: Policy, settings: Settings,
                published_per_min: float | None = None) -> PermitDecision:
    """A permit only if a slot is free now (a warm pool's refill): slots runs have reserved
    ahead stay theirs, so refills take what runs leave."""
    successes = _take(provider)
    rules = _rules(provider, policy, settings, published_per_min)
    permit = _limiter(settings.redis_url, os.getpid(), 0).acquire(
        provider, rules, observed_successes=successes)
    if not permit.granted or permit.degraded:
        _give_back(provider, successes)
    starthistory.record_permit(provider, permit)
    metrics.permit(provider, permit.granted)
    return PermitDecision(permit.granted, permit.wait_ms, permit.epoch, permit.rate,
                          permit.degraded)


def penalize(provider: str, policy: Policy, epoch: int, settings: Settings,
             published_per_min: float | None = None, *, retry_after_s: float | None = None,
             refused_rate: float | None = None) -> bool:
    """Cut the rate after a pushback. retry_after_s: the server's own wait, which shortens
    the cooldown (a fleet held past it idles while the provider would accept).
    refused_rate: the rate of a create the provider rate-limited, which becomes the
    fleet's ceiling (ceiling.py)."""
    if refused_rate is not None:
        # The bucket's rate is what it allowed, not what was made: a fleet that started
        # fast finds the provider's limit in what it was granted over the last minute.
        granted = starthistory.grants_last_minute(provider)
        if granted is not None:
            refused_rate = min(refused_rate, granted)
        ceiling.learn(settings.redis_url, provider, refused_rate,
                      settings.start_rate_floor_per_min)
    rules = _rules(provider, policy, settings, published_per_min)
    cooldown_ms = settings.start_rate_cooldown_ms
    if retry_after_s is not None and retry_after_s >= 0:
        cooldown_ms = min(cooldown_ms, int(retry_after_s * 1000))
    penalty = limiter().penalize_detail(provider, rules, epoch, cooldown_ms)
    starthistory.record_penalty(provider, penalty)
    if penalty.applied:  # other workers reporting the same epoch's pushback change nothing
        metrics.penalty(provider)
    return penalty.applied
