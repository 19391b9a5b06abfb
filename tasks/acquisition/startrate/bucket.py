"""The fleet-wide sandbox start-rate bucket in Redis (docs/design.md).

One Lua script per operation (``lua/acquire.lua``, ``penalize.lua``, ``inspect.lua``),
each atomic, with Redis ``TIME`` as the clock; ``lua/prelude.lua`` (the clock, the
unpacking of ARGV and the read of a rule's hash) is put in front of each when it is
loaded. A bucket's rules live in one hash each, ``<prefix>{<bucket>}:rule:<name>``: the
braces are a hash tag, so every key a script touches sits in one slot and the scripts
run on Redis Cluster.

Each call's numbers travel packed in one argument, and acquire answers with one status
line: per call, redis-py spent more packing ten arguments and parsing a six-element
reply than Redis spent running the script.

Redis trouble never reaches the caller: on any Redis error the limiter hands out a
``degraded`` permit from a per-process in-memory GCRA at the initial rate (or the
override), logs a warning at most once a minute, and after a connection failure or
timeout skips Redis for ``breaker_ms`` so a dead server costs no latency per call. A
reply of the wrong shape degrades the same way (a StartRateReplyError, logged with its
code, never re-sent), without the breaker.

Create one limiter per process and keep it: it owns a connection pool and the
warning throttle.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any, Protocol

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool

from tasks.acquisition.startrate import maths
from tasks.acquisition.startrate.fallback import LocalStartRateLimiter
from tasks.acquisition.startrate.maths import MPM, Penalty, Permit, RateRule, RuleState
from tasks.constants import KEY_START_RATE
from tasks.errors import StartRateReplyError
from tasks.settings import Settings
from tasks.store import redisconn

log = logging.getLogger(__name__)

WARN_EVERY_S = 60.0
# Connection-pool internals of redis-py 8 that belong to the original pool, not ours.
_POOL_PRIVATE = frozenset({
    "maint_notifications_pool_handler", "himport_registry", "orig_host_address",
    "orig_socket_timeout", "orig_socket_connect_timeout", "retry_on_timeout",
    "retry_on_error",
})


class ScriptClient(Protocol):
    """The two commands the limiter sends (a redis.Redis, or a fake in tests).

    The limiter sends bytes (a packed ARGV is binary); redis-py types them as str.
    """

    def evalsha(self, sha: Any, numkeys: int, *keys_and_args: Any) -> Any: ...

    def script_load(self, script: str) -> Any: ...


@dataclass(frozen=True)
class Script:
    name: str
    body: str
    sha: str
    sha_bytes: bytes  # as sent: redis-py packs bytes as they are


def _lua(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


@cache
def load_script(name: str) -> Script:
    """Read a script (after the shared prelude) once; its SHA1 is computed locally.

    redis-py's register_script does the same EVALSHA-then-load, but it needs a real
    client (the limiter also takes test fakes) and hides the NOSCRIPT reloads the
    limiter counts; _run keeps that one rule: only NOSCRIPT (nothing ran) re-sends.
    """
    body = _lua("prelude") + _lua(name)
    sha = hashlib.sha1(body.encode("utf-8")).hexdigest()
    return Script(name, body, sha, sha.encode("ascii"))


def no_retry_client(client: redis.Redis, socket_timeout_s: float) -> redis.Redis:
    """A client on the same server whose commands are never re-sent.

    redis-py retries commands on TimeoutError by default (10 times, with backoff); a
    timed-out acquire may have run on the server, so re-sending it could reserve two
    slots. The copy has zero retries and a bounded socket timeout.
    """
    pool = client.connection_pool
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k not in _POOL_PRIVATE}
    kwargs["retry"] = Retry(NoBackoff(), 0)
    for name in ("socket_timeout", "socket_connect_timeout"):
        current = kwargs.get(name)
        kwargs[name] = socket_timeout_s if current is None else min(current, socket_timeout_s)
    own: redis.ConnectionPool
    if isinstance(pool, SentinelConnectionPool):  # still asks the sentinels for the primary
        own = redisconn.following(pool, **kwargs)
    else:
        own = redis.ConnectionPool(
            connection_class=pool.connection_class, max_connections=pool.max_connections,
            **kwargs)
    return redis.Redis(connection_pool=own)


@lru_cache(maxsize=1024)
def _params(rule: RateRule) -> maths.Params:
    return maths.params_of(rule)


_EXACT = 2 ** 53  # doubles hold every integer below this exactly


def _pack(values: Sequence[int]) -> bytes:
    """ARGV[1] of every script: integers as little-endian doubles (prelude.lua).

    Lua reads a double with no conversion; every value is an integer below 2^53.
    """
    if any(not -_EXACT < v < _EXACT for v in values):
        raise ValueError(f"start-rate numbers must stay below 2^53: {values!r}")
    return struct.pack(f"<{len(values)}d", *values)


@lru_cache(maxsize=1024)
def _rule_packed(rule: RateRule, script: str) -> bytes:
    """A rule's numbers for one script, packed: only the numbers that script reads."""
    p = _params(rule)
    if script == "acquire":
        values: tuple[int, ...] = (p.initial_mpm, p.max_mpm, p.floor_mpm, p.increase_mpm,
                                   p.fixed_mpm)
    elif script == "penalize":
        values = (p.initial_mpm, p.max_mpm, p.floor_mpm, p.decrease_ppm, p.fixed_mpm)
    else:
        values = (p.initial_mpm, p.max_mpm, p.floor_mpm, p.fixed_mpm)
    return _pack(values)


@lru_cache(maxsize=1024)
def _keys(prefix: str, bucket: str, names: tuple[str, ...]) -> tuple[str, ...]:
    if not bucket or "{" in bucket or "}" in bucket:
        raise ValueError(f"bucket name must be non-empty without braces: {bucket!r}")
    if not names or len(set(names)) != len(names):
        raise ValueError(f"rules need distinct names: {names!r}")
    return tuple(f"{prefix}{{{bucket}}}:rule:{name}" for name in names)


def _call(prefix: str, bucket: str, rules: Sequence[RateRule], script: str,
          head: tuple[int, ...]) -> tuple[bytes, ...]:
    """KEYS then ARGV[1] of one script call (ARGV[2], the test clock, is added apart)."""
    keys = _keys(prefix, bucket, tuple(rule.name for rule in rules))
    packed = _pack(head) + b"".join(_rule_packed(rule, script) for rule in rules)
    return (*(key.encode() for key in keys), packed)


@lru_cache(maxsize=4096)
def _acquire_call(prefix: str, bucket: str, rules: tuple[RateRule, ...], horizon_us: int,
                  idle_ttl_ms: int, successes: int) -> tuple[bytes, ...]:
    # Every part is fixed per limiter, bucket and rules but successes (a small count),
    # so the hot path's arguments are built once.
    return _call(prefix, bucket, rules, "acquire", (horizon_us, idle_ttl_ms, successes))


def _ints(reply: Any, count: int, script: str) -> list[int]:
    """A reply's integers: acquire's is one status line, the others' an array.

    Anything else is odd: a StartRateReplyError, which the limiter never re-sends.
    """
    line = script == "acquire"
    try:
        if isinstance(reply, (bytes, str)) is not line:
            raise TypeError(type(reply))
        values = [int(v) for v in (reply.split() if line else reply)]
    except (TypeError, ValueError):
        values = []
    if len(values) != count:
        raise StartRateReplyError(f"{script} answered {reply!r:.200}, not {count} integers")
    return values


class StartRateLimiter:
    """Acquire, penalize and inspect start-rate buckets in Redis."""

    def __init__(
        self,
        client: redis.Redis | ScriptClient,
        *,
        prefix: str = KEY_START_RATE,
        horizon_ms: int = 1000,
        idle_ttl_ms: int = 600_000,
        socket_timeout_s: float = 2.0,
        breaker_ms: int = 1000,
        clock_us: Callable[[], int] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock_us`` is for tests only: it replaces Redis TIME (sent as ARGV now_us).

        ``monotonic`` drives the warning throttle and the breaker (injectable in tests).
        """
        self._owned: redis.Redis | None = None
        if isinstance(client, redis.Redis):
            self._owned = no_retry_client(client, socket_timeout_s)
        self._client: ScriptClient = self._owned if self._owned is not None else client
        self.prefix = prefix
        self.horizon_ms = max(0, horizon_ms)
        self.idle_ttl_ms = max(1, idle_ttl_ms)
        self.fallback = LocalStartRateLimiter(horizon_ms=self.horizon_ms, clock_us=clock_us)
        self.script_loads = 0  # NOSCRIPT reloads so far (tests, metrics)
        self.degraded_calls = 0
        self._clock_us = clock_us
        self._monotonic = monotonic
        self._breaker_s = breaker_ms / 1000
        self._lock = threading.Lock()
        self._skip_until = float("-inf")
        self._warned_at: float | None = None

    # -- public API --------------------------------------------------------------------

    def acquire(
        self, bucket: str, rules: Sequence[RateRule], observed_successes: int = 1,
    ) -> Permit:
        args = self._acquire_args(bucket, rules, observed_successes)
        if self._redis_skipped():
            return self.fallback.acquire(bucket, rules, observed_successes)
        try:
            granted, scheduled_ms, now_ms, wait_ms, rate_mpm, epoch = _ints(
                self._run("acquire", len(rules), self._with_clock(args)), 6, "acquire")
        except (RedisError, StartRateReplyError) as exc:
            self._degrade(exc, "acquire", bucket)
            return self.fallback.acquire(bucket, rules, observed_successes)
        return Permit(bool(granted), scheduled_ms, now_ms, wait_ms, rate_mpm / MPM, epoch)

    def penalize(
        self, bucket: str, rules: Sequence[RateRule], permit_epoch: int, cooldown_ms: int,
    ) -> bool:
        """Multiplicative decrease and cooldown; False if this epoch was already cut."""
        return self.penalize_detail(bucket, rules, permit_epoch, cooldown_ms).applied

    def penalize_detail(
        self, bucket: str, rules: Sequence[RateRule], permit_epoch: int, cooldown_ms: int,
    ) -> Penalty:
        args = _call(self.prefix, bucket, rules, "penalize",
                     (self.idle_ttl_ms, int(permit_epoch), max(0, cooldown_ms) * 1000))
        if self._redis_skipped():
            return self.fallback.penalize(bucket, rules, permit_epoch, cooldown_ms)
        try:
            applied, rate_mpm, epoch, until_ms, now_ms = _ints(
                self._run("penalize", len(rules), self._with_clock(args)), 5, "penalize")
        except (RedisError, StartRateReplyError) as exc:
            self._degrade(exc, "penalize", bucket)
            return self.fallback.penalize(bucket, rules, permit_epoch, cooldown_ms)
        return Penalty(bool(applied), rate_mpm / MPM, epoch, until_ms, now_ms)

    def inspect(self, bucket: str, rules: Sequence[RateRule]) -> list[RuleState]:
        """Each rule's rate, epoch, TAT and cooldown end; read-only."""
        args = _call(self.prefix, bucket, rules, "inspect", ())
        if self._redis_skipped():
            return self.fallback.inspect(bucket, rules)
        try:
            reply = _ints(self._run("inspect", len(rules), self._with_clock(args)),
                          1 + 6 * len(rules), "inspect")
        except (RedisError, StartRateReplyError) as exc:
            self._degrade(exc, "inspect", bucket)
            return self.fallback.inspect(bucket, rules)
        now_us, out = reply[0], []
        for i, rule in enumerate(rules):
            exists, rate, adaptive, epoch, tat, cooldown = reply[1 + 6 * i: 7 + 6 * i]
            out.append(RuleState(rule.name, bool(exists), rate / MPM, adaptive / MPM,
                                 epoch, tat, cooldown, now_us))
        return out

    def close(self) -> None:
        """Close the limiter's own connection pool (the caller's client stays open)."""
        if self._owned is not None:
            self._owned.close()
            self._owned.connection_pool.disconnect()

    def key(self, bucket: str, rule_name: str) -> str:
        return _keys(self.prefix, bucket, (rule_name,))[0]

    # -- internals ---------------------------------------------------------------------

    def _acquire_args(self, bucket: str, rules: Sequence[RateRule],
                      observed_successes: int = 1) -> tuple[bytes, ...]:
        """KEYS and ARGV[1] of an acquire, as sent (bench_startrate pipelines them)."""
        return _acquire_call(self.prefix, bucket, tuple(rules), self.horizon_ms * 1000,
                             self.idle_ttl_ms, max(0, observed_successes))

    def _with_clock(self, args: tuple[bytes, ...]) -> tuple[bytes, ...]:
        return args if self._clock_us is None else (*args, str(self._clock_us()).encode())

    def _run(self, name: str, numkeys: int, keys_and_args: tuple[bytes, ...]) -> Any:
        """EVALSHA; on NOSCRIPT load the script and run it once more.

        Only NOSCRIPT (nothing ran) re-sends. A timeout or a dropped connection may
        have run the script, so it propagates and the caller degrades instead; so does
        an odd reply (StartRateReplyError), never re-sent either.
        """
        script = load_script(name)
        try:
            return self._client.evalsha(script.sha_bytes, numkeys, *keys_and_args)
        except NoScriptError:
            with self._lock:
                self.script_loads += 1
            self._client.script_load(script.body)
            return self._client.evalsha(script.sha_bytes, numkeys, *keys_and_args)

    def _redis_skipped(self) -> bool:
        with self._lock:
            skipped = self._monotonic() < self._skip_until
            if skipped:
                self.degraded_calls += 1
            return skipped

    def _degrade(self, exc: RedisError | StartRateReplyError, op: str, bucket: str) -> None:
        now = self._monotonic()
        with self._lock:
            self.degraded_calls += 1
            if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
                self._skip_until = now + self._breaker_s
            warn = self._warned_at is None or now - self._warned_at >= WARN_EVERY_S
            if warn:
                self._warned_at = now
        if warn:
            log.warning(
                "start-rate bucket unavailable (%s on %r: %s: %s); pacing this process "
                "in memory at the initial rate until Redis answers",
                op, bucket, type(exc).__name__, exc,
            )


def rules_for(settings: Settings, provider: str, override_per_min: float | None,
              published_per_min: float | None = None) -> list[RateRule]:
    """The rules a start on ``provider`` needs: its adaptive rule, and the global cap if set.

    Use the provider as the bucket name. The "global" rule shares the bucket's hash
    slot, so it caps that bucket; a cap across providers needs one shared bucket.
    An override <= 0 becomes the smallest rate (0.001/min); hold is the way to stop.
    """
    del provider  # the bucket name carries the provider; rules are the same shape
    initial = settings.start_rate_initial_per_min
    maximum = settings.start_rate_max_per_min
    if published_per_min is not None:
        # The provider's published create limit bounds the defaults; an operator's own
        # setting (a higher plan) wins.
        if "start_rate_max_per_min" not in settings.model_fields_set:
            maximum = min(maximum, published_per_min)
        if "start_rate_initial_per_min" not in settings.model_fields_set:
            initial = min(initial, maximum)
    # Settings validate each value alone; order them here so a rule is always valid.
    floor = min(settings.start_rate_floor_per_min, initial)
    maximum = max(maximum, initial)
    fixed = (None if override_per_min is None
             else min(max(override_per_min, 1 / MPM), maths.MAX_RATE_PER_MIN))
    rules = [RateRule(
        "provider", initial, maximum, floor, settings.start_rate_increase_per_min,
        settings.start_rate_decrease_factor, fixed,
    )]
    cap = settings.start_rate_global_max_per_min
    if cap is not None:
        rules.append(RateRule("global", cap, cap, cap, 0.0, 1.0))
    return rules
