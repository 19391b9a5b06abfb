"""Per-attempt budgets at the gateway: requests in flight, and token buckets of requests and
bytes, checked from the token and the headers before a body is read.

One play can then cost the gateway only its own share: past the rate a request is answered
429 `GATEWAY_RATE_LIMITED` with Retry-After (the runner waits and sends it again), so a
flood from one attempt never queues the others' work. This state is per process, in
memory: the gateway keeps it in Redis, fleet-wide (fleet/), and uses this while Redis does
not answer or when PLAYRUN_GATEWAY_SHARED_BUDGETS is off.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from tasks.errors import GatewayRateLimitedError

# Attempts not seen for this long are forgotten (their buckets would be full again anyway).
IDLE_S = 120.0
SWEEP_EVERY = 1024
# Too many requests in flight: come back soon, one is likely answered by then.
IN_FLIGHT_RETRY_S = 0.1


def too_many_in_flight(limit: int) -> GatewayRateLimitedError:
    return GatewayRateLimitedError(f"more than {limit} requests in flight",
                                   retry_after_s=IN_FLIGHT_RETRY_S)


def past_the_rate(wait_s: float) -> GatewayRateLimitedError:
    return GatewayRateLimitedError("past this attempt's request rate", retry_after_s=wait_s)


@dataclass
class _Bucket:
    requests: float
    bytes: float
    at: float
    in_flight: int = 0


@dataclass
class Budgets:
    requests_per_s: float
    request_burst: float
    bytes_per_s: float
    byte_burst: float
    max_in_flight: int
    _buckets: dict[tuple[str, int], _Bucket] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _admitted: int = 0

    def admit(self, key: tuple[str, int], size: int, now: float | None = None) -> None:
        """Take one request of `size` bytes for this attempt, or raise GatewayRateLimitedError
        with how long to wait. The caller must `release` an admitted request."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._admitted += 1
            if self._admitted % SWEEP_EVERY == 0:
                self._sweep(now)
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(self.request_burst, self.byte_burst, now)
            elapsed = max(now - bucket.at, 0.0)
            bucket.requests = min(self.request_burst,
                                  bucket.requests + elapsed * self.requests_per_s)
            bucket.bytes = min(self.byte_burst, bucket.bytes + elapsed * self.bytes_per_s)
            bucket.at = now
            size = min(size, int(self.byte_burst))  # one maximal body is always possible
            if bucket.in_flight >= self.max_in_flight:
                raise too_many_in_flight(self.max_in_flight)
            wait = max((1 - bucket.requests) / self.requests_per_s,
                       (size - bucket.bytes) / self.bytes_per_s, 0.0)
            if wait > 0:
                raise past_the_rate(wait)
            bucket.requests -= 1
            bucket.bytes -= size
            bucket.in_flight += 1

    def release(self, key: tuple[str, int]) -> None:
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is not None:
                bucket.in_flight = max(bucket.in_flight - 1, 0)

    def _sweep(self, now: float) -> None:
        for key in [k for k, b in self._buckets.items()
                    if b.in_flight == 0 and now - b.at > IDLE_S]:
            del self._buckets[key]


def retry_after_header(seconds: float) -> str:
    """Whole seconds, at least 1, as HTTP says; the body carries the precise wait."""
    return str(max(1, math.ceil(seconds)))
