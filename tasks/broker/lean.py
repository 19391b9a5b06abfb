"""Task messages into the broker (start messages, and the gateway's releases): many in one
Redis pipeline, one round trip.

Celery's send_task costs about a millisecond of Python per message (routing, option
merging, the result backend, kombu's publish machinery), more than the transaction
that admitted the run. Here Celery still builds each task message (`as_task_v2`, so
headers and body are exactly what a worker expects), and we write the envelope kombu's
Redis transport would write (an LPUSH of JSON onto the queue's list) for the whole
batch in one pipeline. tests/integration/test_submit_runs.py checks byte for byte, but for the
per-message tags, that this envelope equals what kombu's own producer writes.

Any other broker, or a Redis transport with a key prefix, uses kombu's producer
(pipelined by `Producer.batch`). On RabbitMQ that is a real AMQP publish, each one
confirmed by the broker (tasks/broker/config.py), to a queue it declares first.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from kombu.utils.json import dumps as kombu_dumps

from tasks.broker import rabbit
from tasks.broker.config import is_amqp, make_queue
from tasks.broker.message import Message, start_queue
from tasks.broker.taskrepr import shown
from tasks.constants import QUEUE
from tasks.store.notify import redis_client

# Commands per pipeline flush: bounded memory for a huge batch.
_PIPELINE = 500
# A start message is a few KiB; anything far larger at the tail is not one of ours.
_MAX_ENVELOPE = 1 << 20


def dumps(value: Any) -> str:
    """kombu's JSON (its encoder for dates, UUIDs and decimals), as its transport uses."""
    return str(kombu_dumps(value))  # type: ignore[no-untyped-call]


def _direct_url(app: Any) -> str | None:
    """The broker's URL for playrun's own client when our envelope is kombu's: plain Redis
    or Sentinel (the same lists) without a global key prefix; None otherwise."""
    url = str(app.conf.broker_url or "")
    if url.startswith("sentinel://"):  # Celery's form of a redis+sentinel:// URL
        url = str(app.conf.get("playrun_redis_url") or "")
    options = app.conf.broker_transport_options or {}
    plain = url.startswith(("redis://", "rediss://", "redis+sentinel://"))
    if plain and not options.get("global_keyprefix") and "priority_steps" not in options \
            and "sep" not in options:
        return url
    return None


def envelope(app: Any, task_id: str, name: str, args: list[Any], queue: str = QUEUE) -> str:
    """The JSON kombu's Redis transport stores for this task on `queue`."""
    m = app.amqp.as_task_v2(task_id, name, args=args, ignore_result=True,
                            argsrepr=shown(name, args), kwargsrepr="{}")
    properties = dict(m.properties)
    properties.update(
        delivery_mode=2, priority=0, body_encoding="base64",
        delivery_info={"exchange": "", "routing_key": queue},
        delivery_tag=str(uuid.uuid4()),
    )
    body = base64.b64encode(dumps(m.body).encode("utf-8")).decode("ascii")
    return dumps({"body": body, "content-encoding": "utf-8",
                  "content-type": "application/json", "headers": m.headers,
                  "properties": properties})


def push(client: redis.Redis, app: Any, messages: Sequence[Message], queue: str) -> None:
    if len(messages) == 1:  # submit_run: one command needs no pipeline object
        task_id, name, args = messages[0]
        client.lpush(queue, envelope(app, task_id, name, args, queue))
        return
    for start in range(0, len(messages), _PIPELINE):
        pipe = client.pipeline(transaction=False)
        for task_id, name, args in messages[start:start + _PIPELINE]:
            pipe.lpush(queue, envelope(app, task_id, name, args, queue))
        pipe.execute()


def produce(app: Any, messages: Sequence[Message], queue: str, url: str | None = None) -> None:
    url = str(app.conf.broker_url or "") if url is None else url
    declare = None
    if is_amqp(url):
        # RabbitMQ drops (and confirms) a message for a queue that does not exist yet: it
        # is declared first. A batch's confirms are waited for together; one message goes
        # on the producer's channel kept open (its confirm waited for alone).
        if len(messages) > 1:
            timeout_s = float(app.conf.broker_transport_options["read_timeout"])
            for start in range(0, len(messages), _PIPELINE):
                rabbit.publish_batch(
                    app, [_built(app, m) for m in messages[start:start + _PIPELINE]], queue,
                    timeout_s)
            return
        declare = [make_queue(queue, url)]  # once per connection: kombu remembers
    with app.producer_or_acquire() as producer, producer.batch(max_size=_PIPELINE):
        for task_id, name, args in messages:
            m = app.amqp.as_task_v2(task_id, name, args=args, ignore_result=True,
                                    argsrepr=shown(name, args), kwargsrepr="{}")
            producer.publish(m.body, exchange="", routing_key=queue, headers=m.headers,
                             serializer="json", retry=False, declare=declare, **m.properties)


def _built(app: Any, message: Message) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    task_id, name, args = message
    m = app.amqp.as_task_v2(task_id, name, args=args, ignore_result=True,
                            argsrepr=shown(name, args), kwargsrepr="{}")
    return m.body, m.headers, dict(m.properties)


def oldest_waiting(app: Any, queue: str = QUEUE) -> str | None:
    """The task id of the oldest message still waiting on `queue` (kombu's Redis transport
    pushes on the left and pops on the right), or None: an empty queue, another broker
    (RabbitMQ shows no message without delivering it), or a message that is not a
    task's."""
    url = _direct_url(app)
    if url is None:
        return None
    try:
        raw = redis_client(url).lindex(queue, -1)
    except redis.RedisError:
        return None  # the resend's publish meets the same broker, and says so
    if not isinstance(raw, bytes) or len(raw) > _MAX_ENVELOPE:
        return None
    try:
        task_id = json.loads(raw)["headers"]["id"]
    except (ValueError, KeyError, TypeError):
        return None
    return task_id if isinstance(task_id, str) and len(task_id) <= 64 else None


def queue_length(app: Any, queues: Sequence[str]) -> int:
    """Messages waiting on `queues` in all, in one round trip (0 when another broker does
    not say)."""
    if is_amqp(str(app.conf.broker_url or "")):
        return rabbit.ready(app, queues)
    url = _direct_url(app)
    if url is None:
        return 0
    pipe = redis_client(url).pipeline(transaction=False)
    for name in queues:
        pipe.llen(name)
    return sum(n for n in pipe.execute() if isinstance(n, int))


def send_tasks(app: Any, messages: Sequence[Message], queue: str = QUEUE) -> None:
    """Publish every message or raise (a broker error: the caller leaves them to the sweep).

    A pipeline the client re-sends after a dropped connection may push a message twice:
    harmless, like every duplicate (the claim in start_attempt decides).
    """
    if not messages:
        return
    url = _direct_url(app)  # Celery's settings are slow to read: once
    for name, group in _by_queue(messages, queue).items():
        if url is not None:
            push(redis_client(url), app, group, name)
        else:
            produce(app, group, name, url)



def _by_queue(messages: Sequence[Message], queue: str) -> dict[str, list[Message]]:
    """Starts placed on a provider go to its queue; the rest to `queue`."""
    if queue != QUEUE:
        return {queue: list(messages)}
    out: dict[str, list[Message]] = {}
    for message in messages:
        out.setdefault(start_queue(message[2]), []).append(message)
    return out
