"""The fleet-wide gateway budgets as pure Python: the maths the Lua scripts (lua/) run in
Redis, step for step, so a hypothesis test can feed both the same calls and compare every
answer and every stored field.

Integers only, every value below 2^53 (where Lua's doubles are exact):
  time      microseconds (Redis TIME); the refusal count's in milliseconds
  requests  one request = REQUEST units; a rate of R milli-requests/s refills R units/us
  bytes     one byte = BYTE units; a rate of B bytes/s refills B units/us
  refusals  one refusal = window_ms units; the count drains `limit` units per ms
"""

from __future__ import annotations

from dataclasses import dataclass, field

REQUEST = 1_000_000_000
BYTE = 1_000_000
EXACT = 2 ** 53
# Keys live at least this long after their last write, whatever their state says: an
# attempt seen again within it finds its state where it left it.
IDLE_MS = 60_000
# A request of a gateway process that died is forgotten from the in-flight set this long
# after it was admitted (a live process releases it when it is answered).
HOLD_MS = 60_000
# Admitted requests at the limit: come back in 0.1 s, as the in-memory budgets say.
IN_FLIGHT_WAIT_US = 100_000
# A failed attempt stays failed at least this long (refusals.IDLE_S).
FAILED_MIN_US = 120_000_000

# Answers of admit.
ADMITTED, IN_FLIGHT, WAIT, FAILED = 0, 1, 2, 3
# Answers of refuse.
COUNTED, TRIPPED, ALREADY_FAILED = 0, 1, 2


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) as Lua computes it: exact for |a| < 2^53, b >= 1."""
    return -(-a // b)


@dataclass(frozen=True)
class Params:
    """One gateway's budgets in the scripts' units (built once per process)."""

    request_rate: int  # units/us (milli-requests per second)
    request_burst: int  # units
    byte_rate: int  # units/us (bytes per second)
    byte_burst: int  # units
    byte_cap: int  # bytes: a request takes at most this many (one maximal body is possible)
    max_in_flight: int
    hold_us: int
    limit: int  # refusals per window
    window_ms: int
    idle_ms: int = IDLE_MS

    @classmethod
    def of(cls, requests_per_s: float, request_burst: float, bytes_per_s: float,
           byte_burst: float, max_in_flight: int, abuse_refusals: int, abuse_window_s: float,
           hold_ms: int = HOLD_MS) -> Params:
        """From the settings; values the integers cannot hold are held at what they can
        (a burst of 9 million requests, 9 GB of bytes: no budget in practice)."""
        top = EXACT // 2 - 1
        request_rate = min(max(1, round(requests_per_s * 1000)), top // 1_000_000)
        byte_rate = min(max(1, round(bytes_per_s)), top // 1_000_000)
        burst = min(max(REQUEST, round(request_burst * REQUEST)), top)
        bytes_ = min(max(BYTE, round(byte_burst) * BYTE), top)
        window_ms = min(max(1, round(abuse_window_s * 1000)), top)
        limit = min(max(1, abuse_refusals), top // window_ms - 1)
        return cls(request_rate, burst, byte_rate, bytes_, bytes_ // BYTE,
                   max(1, max_in_flight), hold_ms * 1000, limit, window_ms)


@dataclass
class State:
    """What Redis holds of one attempt: the bucket hash, the abuse hash and the in-flight
    sorted set (member: request id, score: when its hold expires, us)."""

    requests: int | None = None  # r: units; None: no key (a full bucket)
    bytes: int | None = None  # b
    at_us: int | None = None  # t: the last admission
    level: int | None = None  # l: the refusal count, units
    level_at_ms: int | None = None  # u: the last refusal
    failed_until_us: int | None = None  # x: the attempt was failed GATEWAY_ABUSE
    codes: dict[str, int] = field(default_factory=dict)  # refusals by code
    flight: dict[str, int] = field(default_factory=dict)
    # What the last write's PEXPIRE set (ms), per key: bucket, abuse, flight.
    ttl_ms: dict[str, int] = field(default_factory=dict)


def _refill(level: int | None, burst: int, rate: int, elapsed: int) -> int:
    if level is None or elapsed >= ceil_div(burst - level, rate):
        return burst
    return level + elapsed * rate


def admit(p: Params, s: State, now: int, size: int, rid: str) -> tuple[int, int]:
    """(answer, wait in us); admitted: one request and `size` bytes taken, `rid` held."""
    if (s.failed_until_us or 0) > now:
        return FAILED, 0
    s.flight = {m: exp for m, exp in s.flight.items() if exp > now}
    if len(s.flight) >= p.max_in_flight:
        return IN_FLIGHT, IN_FLIGHT_WAIT_US
    elapsed = max(now - (s.at_us if s.at_us is not None else now), 0)
    r = _refill(s.requests, p.request_burst, p.request_rate, elapsed)
    b = _refill(s.bytes, p.byte_burst, p.byte_rate, elapsed)
    size = min(max(size, 0), p.byte_cap)
    wait = max(ceil_div(REQUEST - r, p.request_rate), ceil_div(size * BYTE - b, p.byte_rate), 0)
    if wait > 0:
        return WAIT, wait
    s.requests, s.bytes, s.at_us = r - REQUEST, b - size * BYTE, now
    s.flight[rid] = now + p.hold_us
    # The bucket outlives the time it takes to fill again: a key gone is a full bucket.
    full_us = max(ceil_div(p.request_burst - s.requests, p.request_rate),
                  ceil_div(p.byte_burst - s.bytes, p.byte_rate))
    s.ttl_ms["bucket"] = p.idle_ms + ceil_div(full_us, 1000)
    s.ttl_ms["flight"] = p.idle_ms + ceil_div(p.hold_us, 1000)
    return ADMITTED, 0


def release(s: State, rid: str) -> None:
    s.flight.pop(rid, None)


def refuse(p: Params, s: State, now: int, code: str, keep_us: int
           ) -> tuple[int, dict[str, int]]:
    """Count one refusal: (answer, refusals by code when this one tripped the budget)."""
    if (s.failed_until_us or 0) > now:
        return ALREADY_FAILED, {}
    now_ms = now // 1000
    level = s.level or 0
    elapsed = max(now_ms - (s.level_at_ms if s.level_at_ms is not None else now_ms), 0)
    level = 0 if elapsed >= ceil_div(level, p.limit) else level - elapsed * p.limit
    level += p.window_ms
    s.codes[code] = s.codes.get(code, 0) + 1
    s.level, s.level_at_ms = level, now_ms
    # The count outlives the time it takes to drain: a key gone is a count of zero.
    ttl = p.idle_ms + ceil_div(level, p.limit)
    if level > p.limit * p.window_ms:
        s.failed_until_us = now + max(keep_us, FAILED_MIN_US)
        s.ttl_ms["abuse"] = max(ttl, ceil_div(s.failed_until_us - now, 1000) + p.idle_ms)
        return TRIPPED, dict(s.codes)
    s.ttl_ms["abuse"] = ttl
    return COUNTED, {}
