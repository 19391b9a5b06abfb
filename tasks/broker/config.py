"""The Celery settings that follow the broker: Redis (the default) or RabbitMQ.

celeryconfig reads them once; `rebind` applies them again to a running app whose
settings changed (the test stacks, `playrun dev`), dropping what Celery built for the
old broker (connection pools, declared queues, the router).

On RabbitMQ every playrun queue is a quorum queue behind a topic exchange of its name:
quorum queues keep their messages through a node restart, and a non-direct exchange
lets Celery's native delayed delivery hold a countdown in the broker instead of in a
worker's prefetch slot (per-consumer prefetch, all quorum queues allow, never grows).
Publisher confirms make every publish wait for the broker's ack: a publish the broker
did not take raises, and the outbox keeps the run until its resend is taken.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kombu import Exchange, Queue  # type: ignore[attr-defined]

from tasks.constants import (
    AMQP_QUEUE_ARGUMENTS,
    AMQP_SCHEMES,
    MAINTENANCE_QUEUE,
    QUEUE,
    RELEASE_QUEUE,
)
from tasks.store.netguard import redis_socket_options

if TYPE_CHECKING:  # `import tasks` reads no setting: the app module imports this one
    from tasks.settings import Settings

REDIS_TRANSPORT = "tasks.broker.transport:Transport"
# Every worker consumes these; host and provider queues are added per worker (tasks/worker/boot).
SHARED_QUEUES = (QUEUE, MAINTENANCE_QUEUE, RELEASE_QUEUE)


def is_amqp(url: str) -> bool:
    return urlsplit(url).scheme in AMQP_SCHEMES


def make_queue(name: str, broker_url: str) -> Queue:
    """A queue by name on an exchange of the same name, as this broker wants it."""
    if is_amqp(broker_url):
        return Queue(name, Exchange(name, type="topic"), routing_key=name,  # type: ignore[no-untyped-call]
                     queue_arguments=dict(AMQP_QUEUE_ARGUMENTS))
    return Queue(name, Exchange(name, type="direct"), routing_key=name)  # type: ignore[no-untyped-call]


def amqp_countdown(countdown: float | None) -> float | None:
    """RabbitMQ's delayed delivery counts whole seconds (a fraction under one would fail
    the publish): a positive countdown is rounded up."""
    if countdown is None or countdown <= 0:
        return countdown
    return float(max(1, math.ceil(countdown)))


def broker_settings(settings: Settings) -> dict[str, Any]:
    """Celery's broker settings for `settings` (celeryconfig's and rebind's)."""
    url = settings.celery_broker_url
    out: dict[str, Any] = {
        "broker_url": url,
        "task_queues": tuple(make_queue(name, url) for name in SHARED_QUEUES),
        "task_default_exchange_type": "topic" if is_amqp(url) else "direct",
    }
    if is_amqp(url):
        out.update(
            broker_transport=None,
            broker_transport_options={
                # Each publish waits for the broker's ack; a nack or a lost connection raises.
                "confirm_publish": True,
                # A silent broker fails a read or a write, never hangs it (as on Redis).
                "read_timeout": settings.network_timeout_s,
                "write_timeout": settings.network_timeout_s,
            },
            # Heartbeats find a dead connection in about two of these.
            broker_heartbeat=settings.network_timeout_s,
        )
        return out
    # redis+sentinel:// becomes Celery's sentinel:// list and its master_name option (read
    # when the app is configured: `import tasks` imports no Redis client).
    from tasks.store.redisconn import celery_settings

    redis = celery_settings(url)
    out.update(
        broker_url=redis["broker_url"],
        broker_transport=redis["transport"],
        # Redis redelivers unacked messages after this; it must outlive every countdown we
        # schedule (checked in Settings.check), or a waiting message would be delivered
        # twice. A half-open connection fails and is replaced (tasks/store/netguard.py).
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s,
                                  **redis["transport_options"],
                                  **redis_socket_options(settings.network_timeout_s)},
    )
    return out


def rebind(app: Any, settings: Settings) -> None:
    """Point a running app at `settings`' broker and result backend."""
    from tasks.store.redisconn import celery_settings

    results = celery_settings(settings.redis_url)
    app.conf.update(**broker_settings(settings), result_backend=results["result_backend"],
                    playrun_redis_url=settings.redis_url,
                    result_backend_transport_options={
                        **(app.conf.result_backend_transport_options or {}),
                        **results["transport_options"]})
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None
        for cached in ("queues", "default_queue", "default_exchange", "router"):
            amqp.__dict__.pop(cached, None)
