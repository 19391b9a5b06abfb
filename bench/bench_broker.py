"""The start publish on RabbitMQ against the same publish on Redis, side by side.

playrun's publisher sends the same start messages to a Redis broker (the lean publish:
kombu's envelope, one pipelined LPUSH per batch) and to RabbitMQ (kombu's producer, one
confirmed publish per message, quorum queues) in a vhost of its own. Measured in rounds,
interleaved: batches of 100 (the fair relay, the sweep, `submit_runs`) and single
messages (`submit_run` in fifo order). Nothing consumes; each round's messages are purged
after it. The ratio is RabbitMQ's time per message over Redis's.

    python bench/bench_broker.py [-n 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import REDIS_BASE, claim_redis_db

BATCH = 100


def app_for(redis_url: str, broker_url: str) -> Any:
    from tasks.broker.app import create_app
    from tasks.broker.config import rebind
    from tasks.settings import Settings

    app = create_app()
    rebind(app, Settings(redis_url=redis_url, broker_url=broker_url))
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="messages per measurement and round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import redis

    from tasks.broker.publish import CeleryPublisher
    from tasks.constants import QUEUE, TASK_START_ATTEMPT
    from tasks.testing import rabbitmq

    reason = rabbitmq.unavailable()
    if reason:
        sys.exit(f"no RabbitMQ: {reason}")
    db = claim_redis_db(REDIS_BASE, 14)
    redis_url = f"{REDIS_BASE}/{db}"
    vhost = rabbitmq.create_vhost()
    try:
        on_redis = CeleryPublisher(app_for(redis_url, ""))
        on_amqp = CeleryPublisher(app_for(redis_url, rabbitmq.url(vhost)))

        def purge() -> None:
            redis.Redis.from_url(redis_url).delete(QUEUE)
            with on_amqp.app.connection_for_write() as conn:
                conn.default_channel.queue_purge(QUEUE)

        def batches(publisher: CeleryPublisher) -> Callable[[int], None]:
            def run(k: int) -> None:
                for _ in range(k // BATCH):
                    publisher.send_many([(uuid.uuid4().hex, TASK_START_ATTEMPT,
                                          [uuid.uuid4().hex]) for _ in range(BATCH)])
            return run

        def singles(publisher: CeleryPublisher) -> Callable[[int], None]:
            def run(k: int) -> None:
                for _ in range(k):
                    publisher.send_many([(uuid.uuid4().hex, TASK_START_ATTEMPT,
                                          [uuid.uuid4().hex])])
            return run

        what = {("batches of 100", "redis"): batches(on_redis),
                ("batches of 100", "amqp"): batches(on_amqp),
                ("one at a time", "redis"): singles(on_redis),
                ("one at a time", "amqp"): singles(on_amqp)}
        for fn in what.values():  # connect, declare, warm
            fn(BATCH)
        purge()
        spent: dict[tuple[str, str], list[float]] = {key: [] for key in what}
        loads = []
        for _ in range(args.rounds):
            for key, fn in what.items():
                t = time.perf_counter()
                fn(args.n)
                spent[key].append(time.perf_counter() - t)
            purge()
            loads.append(os.getloadavg()[0])
        print(f"{args.rounds} rounds of {args.n} messages each; load average "
              f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
        print(f"{'publish':16} {'Redis us/msg':>13} {'RabbitMQ us/msg':>16}  ratio (range)")
        for label in ("batches of 100", "one at a time"):
            r, a = spent[(label, "redis")], spent[(label, "amqp")]
            each = sorted(x / y for x, y in zip(a, r, strict=True))
            print(f"{label:16} {sum(r) / len(r) / args.n * 1e6:13.1f} "
                  f"{sum(a) / len(a) / args.n * 1e6:16.1f}  {sum(a) / sum(r):6.2f}x "
                  f"({each[0]:.2f}-{each[-1]:.2f})")
    finally:
        rabbitmq.ctl("delete_vhost", vhost)
        redis.Redis.from_url(redis_url).flushdb()


if __name__ == "__main__":
    main()
