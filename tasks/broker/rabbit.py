"""RabbitMQ's own calls: how many messages wait, the batch publish with its confirms
waited for together, and the exchanges a countdown rides.

Celery's native delayed delivery sends a message with a countdown through a chain of
delay queues (celery_delayed_0..27) that a worker declares when it starts, and the
target queue must be bound to it. A process that publishes a countdown before any
worker has started (or to a queue no worker bound yet) declares and binds them itself,
once per process and queue: both are idempotent on the broker.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from amqp.exceptions import NotFound
from kombu.transport.native_delayed_delivery import (
    bind_queue_to_native_delayed_delivery_exchange,
    declare_native_delayed_delivery_exchanges_and_queues,
)

from tasks.broker.config import make_queue
from tasks.errors import BrokerUnavailableError

_lock = threading.Lock()
_bound: set[tuple[str, str]] = set()  # (broker URL, queue) bound in this process
_counter: tuple[int, str, Any] | None = None  # (pid, broker URL, connection)


@contextlib.contextmanager
def pooled(app: Any) -> Iterator[Any]:
    """A connection from the app's pool, given back unconnected after a failure, so the
    next user connects afresh (kombu's own exit closes it for good, and the pool hands
    that closed connection out again)."""
    conn = app.pool.acquire(block=True)
    while getattr(conn, "_closed", False):  # closed for good by kombu yet pooled again
        app.pool.replace(conn)  # out of the pool: a new connection takes its place
        conn = app.pool.acquire(block=True)
    try:
        yield conn
    except BaseException:
        with contextlib.suppress(Exception):
            conn.collect()
        raise
    finally:
        conn.release()


def ready(app: Any, queues: Sequence[str]) -> int:
    """Messages ready (not delivered) on `queues`, as Redis's LLEN counts them: a passive
    declare each; a queue not declared yet holds none. BrokerUnavailableError when the
    broker does not answer (twice: a connection the broker closed fails once)."""
    failure: Exception | None = None
    for _ in range(2):
        try:
            return _ready(_counting(app), queues)
        except Exception as exc:  # noqa: BLE001 - a dead connection fails in many ways
            failure = exc
            _drop_counting()
    raise BrokerUnavailableError(f"RabbitMQ did not answer: {failure!r}") from failure


def _counting(app: Any) -> Any:
    """This process's connection for counting, made on first use (and after a fork or a
    failure): kombu's pooled ones can stay closed after the broker closed them."""
    global _counter
    url = str(app.conf.broker_url or "")
    with _lock:
        held = _counter
        if held is None or held[0] != os.getpid() or held[1] != url:
            held = _counter = (os.getpid(), url, app.connection_for_write())
    return held[2]


def _drop_counting() -> None:
    global _counter
    with _lock:
        held, _counter = _counter, None
    if held is not None and held[0] == os.getpid():
        with contextlib.suppress(Exception):
            held[2].collect()


def _ready(conn: Any, queues: Sequence[str]) -> int:
    conn.ensure_connection(max_retries=0)  # once: the caller decides what a failure means
    total = 0
    channel = conn.channel()
    try:
        for name in queues:
            try:
                total += int(channel.queue_declare(queue=name, passive=True)[1])
            except NotFound:  # the broker closed the channel: another for the rest
                channel = conn.channel()
    finally:
        channel.close()
    return total


def ensure_delayed(app: Any, queue: str) -> None:
    """The delay exchanges exist and `queue` is bound to them (declared on first use)."""
    url = str(app.conf.broker_url or "")
    if (url, queue) in _bound:
        return
    with _lock, pooled(app) as conn:
        if not any(bound_url == url for bound_url, _ in _bound):
            declare_native_delayed_delivery_exchanges_and_queues(
                conn, app.conf.broker_native_delayed_delivery_queue_type)
        target = make_queue(queue, url)
        target(conn.default_channel).declare()  # type: ignore[no-untyped-call]
        bind_queue_to_native_delayed_delivery_exchange(conn, target)
        _bound.add((url, queue))


def publish_batch(app: Any, built: Sequence[tuple[Any, dict[str, Any], dict[str, Any]]],
                  queue: str, timeout_s: float) -> None:
    """Publish (body, headers, properties) task messages to `queue` on one channel and
    wait for the broker's confirms of all of them together (one confirm wait per message,
    kombu's way, costs a round trip and a quorum commit each); raises unless every one is
    acked: a nack, a lost connection or `timeout_s` without the last ack."""
    from amqp.exceptions import MessageNacked
    from amqp.spec import Basic
    from kombu.serialization import dumps as serialize

    acked = [0]  # the highest delivery tag confirmed so far, with all below it
    seen: set[int] = set()

    def on_ack(tag: int, multiple: bool) -> None:
        seen.add(tag)
        if multiple:
            acked[0] = max(acked[0], tag)
        while acked[0] + 1 in seen:
            acked[0] += 1

    def on_nack(tag: int, multiple: bool) -> None:
        raise MessageNacked(f"the broker refused message {tag} of {len(built)}")

    with pooled(app) as conn:
        target = make_queue(queue, str(app.conf.broker_url or ""))
        channel = conn.channel()  # a new channel numbers its publishes from 1
        try:
            target(channel).declare()  # type: ignore[no-untyped-call]
            channel.confirm_select()
            channel._confirm_selected = True
            channel.events["basic_ack"].add(on_ack)
            channel.events["basic_nack"].add(on_nack)
            for body, headers, properties in built:
                content_type, encoding, data = serialize(body, serializer="json")  # type: ignore[no-untyped-call]
                message = channel.prepare_message(
                    data, 0, content_type, encoding, headers,
                    {"delivery_mode": 2, **properties})
                channel._basic_publish(message, exchange="", routing_key=queue)
            deadline = time.monotonic() + timeout_s
            while acked[0] < len(built):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(built) - acked[0]} publishes not confirmed "
                                       f"in {timeout_s:g}s")
                channel.wait([Basic.Ack, Basic.Nack], timeout=left)
        finally:
            with contextlib.suppress(Exception):
                channel.close()
