"""The plain-Celery baseline of bench_throughput.py: a no-op task that counts itself.

Same broker, same ack and prefetch settings as playrun's workers, so the comparison is
of what playrun adds per run, not of Celery configuration.
"""

from __future__ import annotations

import os

import redis
from celery import Celery

app = Celery("plain", broker=os.environ["PLAYRUN_REDIS_URL"])
app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True,
                worker_prefetch_multiplier=1, task_ignore_result=True,
                task_default_queue="bench.plain", task_serializer="json",
                accept_content=["json"], worker_hijack_root_logger=False)
_counter = redis.Redis.from_url(os.environ["PLAYRUN_REDIS_URL"])


@app.task(name="bench.count")
def count(key: str) -> None:
    _counter.incr(key)
