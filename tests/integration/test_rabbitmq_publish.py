"""Publishing to RabbitMQ (a vhost of this module's own on this machine's broker): the
batch publish writes the envelope a worker reads onto quorum queues, confirmed; a
countdown waits in the broker, not in a worker; a publish the broker refuses, or a broker
that does not answer, raises for the caller to leave the run to the outbox."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from amqp.exceptions import MessageNacked

from tasks.broker.publish import CeleryPublisher
from tasks.constants import QUEUE, TASK_START_ATTEMPT, TASK_WATCHDOG_PING
from tasks.errors import BrokerUnavailableError
from tasks.testing import rabbitmq
from tests.support.helpers import eventually

LOCAL = "playrun.provider.local"


def use_broker(monkeypatch: pytest.MonkeyPatch, url: str) -> Any:
    from tasks.broker.app import app
    from tasks.broker.config import rebind
    from tasks.settings import get_settings, reset_settings

    monkeypatch.setenv("PLAYRUN_BROKER_URL", url)
    reset_settings()
    rebind(app, get_settings())
    return app


@pytest.fixture
def app(rabbitmq_vhost: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The app on the session's vhost, its start queues empty; back on Redis after."""
    from tasks.broker.config import rebind
    from tasks.settings import get_settings, reset_settings

    celery_app = use_broker(monkeypatch, rabbitmq.url(rabbitmq_vhost))
    celery_app.vhost = rabbitmq_vhost
    CeleryPublisher(celery_app).waiting([QUEUE, LOCAL])  # the connection, before the purge
    for name in (QUEUE, LOCAL):
        take(celery_app, name)
    try:
        yield celery_app
    finally:
        monkeypatch.undo()
        reset_settings()
        rebind(celery_app, get_settings())


def take(app: Any, queue: str) -> list[Any]:
    """Every message waiting on `queue`, consumed."""
    from amqp.exceptions import NotFound

    out = []
    with app.connection_for_write() as conn:
        channel = conn.channel()
        try:
            while (message := channel.basic_get(queue=queue, no_ack=True)) is not None:
                out.append(message)
        except NotFound:  # never declared: nothing waits on it
            pass
    return out


def test_a_batch_goes_to_quorum_queues_in_the_envelope_a_worker_reads(app: Any) -> None:
    publisher = CeleryPublisher(app)
    publisher.send_many([("t1", TASK_START_ATTEMPT, ["r1"]), ("t2", TASK_START_ATTEMPT, ["r2"]),
                         ("t3", TASK_START_ATTEMPT, ["r3", "local"])])
    # Confirmed means taken: the counts are there as the publish returns.
    assert publisher.waiting([QUEUE]) == 2 and publisher.waiting([QUEUE, LOCAL]) == 3
    assert publisher.oldest_waiting() is None  # RabbitMQ shows no message unless it delivers it
    queues = rabbitmq.queues(app.vhost)
    assert queues[QUEUE][0] == queues[LOCAL][0] == "quorum"
    started = take(app, QUEUE)
    assert [(m.headers["id"], m.headers["task"], m.headers["argsrepr"]) for m in started] == [
        ("t1", TASK_START_ATTEMPT, "run_id=r1"), ("t2", TASK_START_ATTEMPT, "run_id=r2")]
    assert started[0].properties["delivery_mode"] == 2  # persistent
    assert [m.headers["id"] for m in take(app, LOCAL)] == ["t3"]
    assert publisher.waiting([QUEUE, LOCAL, "playrun.provider.never-declared"]) == 0


def test_a_countdown_waits_in_the_broker_then_arrives(app: Any) -> None:
    publisher = CeleryPublisher(app)
    began = time.monotonic()
    # Under a second: RabbitMQ's delays count whole seconds, so this one is rounded up.
    publisher.send(TASK_START_ATTEMPT, ["r1"], task_id="later", countdown=0.2)
    assert publisher.waiting([QUEUE]) == 0  # held by the broker's delay queues
    eventually(lambda: publisher.waiting([QUEUE]) == 1, timeout=10, every=0.1,
               what="the delayed start")
    assert time.monotonic() - began >= 0.9
    assert [m.headers["id"] for m in take(app, QUEUE)] == ["later"]


def test_a_refused_publish_raises(app: Any) -> None:
    publisher = CeleryPublisher(app)
    publisher.send(TASK_WATCHDOG_PING, [], queue=QUEUE)  # declares the queue: one message
    rabbitmq.refuse_publishes(app.vhost, QUEUE)
    with pytest.raises(MessageNacked):
        publisher.send_many([("t1", TASK_START_ATTEMPT, ["r1"])])
    rabbitmq.allow_publishes(app.vhost)
    publisher.send_many([("t1", TASK_START_ATTEMPT, ["r1"])])
    assert [m.headers["id"] for m in take(app, QUEUE)][-1] == "t1"


def test_a_broker_that_does_not_answer_is_unavailable_at_once(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.host.processes import free_port

    down = use_broker(monkeypatch, f"amqp://guest:guest@127.0.0.1:{free_port()}//")
    publisher = CeleryPublisher(down)
    began = time.monotonic()
    with pytest.raises(BrokerUnavailableError):  # the fair relay's pass ends, the sweep retries
        publisher.waiting([QUEUE])
    assert time.monotonic() - began < 5  # one try per connection, not kombu's retries
