"""One process contending for a start-rate bucket, as a worker does: acquire, sleep to a
reserved slot, count the start; prints its starts as JSON when its time is up.

    python -m tests.support.contender URL BUCKET RATE_PER_MIN START_AT SECONDS RULES

All contenders start at START_AT (epoch seconds), after their imports, so they overlap.
"""

from __future__ import annotations

import json
import sys
import time

from redis.backoff import NoBackoff
from redis.retry import Retry

from tasks.acquisition.startrate import RateRule, StartRateLimiter
from tasks.store import redisconn


def main(url: str, bucket: str, rate: float, start_at: float, seconds: float,
         rules: int) -> None:
    options = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
    if redisconn.parse(url).kind == "cluster":
        options["retry"] = Retry(NoBackoff(), 0)
    limiter = StartRateLimiter(redisconn.script_client(url, **options), horizon_ms=1000)
    # Fixed rate (no growth); a second rule makes an acquire touch two keys.
    chosen = [RateRule(f"r{i}", rate, rate, rate, 0.0, 0.5) for i in range(rules)]
    starts: list[tuple[float, bool]] = []
    time.sleep(max(0.0, start_at - time.time()))
    end = start_at + seconds
    while time.time() < end:
        permit = limiter.acquire(bucket, chosen, observed_successes=0)
        if permit.granted:
            wait = permit.scheduled_at_ms - permit.server_now_ms
            if wait > 1:
                time.sleep(wait / 1000)
            starts.append((time.time(), permit.degraded))
        else:
            time.sleep(max(permit.wait_ms, 1) / 1000)
    json.dump({"starts": starts, "degraded_calls": limiter.degraded_calls}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]),
         int(sys.argv[6]))
