"""The broker choice: Redis unless PLAYRUN_BROKER_URL names RabbitMQ, and what Celery is
told for each (queues, transport, confirms); results and buckets stay on Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tasks.broker.config import REDIS_TRANSPORT, amqp_countdown, broker_settings, rebind
from tasks.constants import MAINTENANCE_QUEUE, QUEUE, RELEASE_QUEUE
from tasks.errors import ConfigurationError
from tasks.settings import Settings

AMQP = "amqp://guest:guest@127.0.0.1:5672/playrun"


def test_redis_is_the_broker_unless_another_is_named() -> None:
    settings = Settings(redis_url="redis://127.0.0.1:6379/3", broker_url="").check()
    assert settings.celery_broker_url == "redis://127.0.0.1:6379/3"
    conf = broker_settings(settings)
    assert conf["broker_url"] == settings.redis_url
    assert conf["broker_transport"] == REDIS_TRANSPORT
    assert conf["broker_transport_options"]["visibility_timeout"] == settings.visibility_timeout_s
    assert [(q.name, q.exchange.type, q.queue_arguments) for q in conf["task_queues"]] == [
        (QUEUE, "direct", None), (MAINTENANCE_QUEUE, "direct", None),
        (RELEASE_QUEUE, "direct", None)]


def test_rabbitmq_gets_quorum_queues_confirms_and_heartbeats() -> None:
    settings = Settings(redis_url="redis://127.0.0.1:6379/3", broker_url=AMQP,
                        network_timeout_s=8).check()
    conf = broker_settings(settings)
    assert conf["broker_url"] == AMQP and conf["broker_transport"] is None
    assert conf["broker_transport_options"] == {"confirm_publish": True, "read_timeout": 8,
                                                "write_timeout": 8}
    assert conf["broker_heartbeat"] == 8
    # Topic exchanges: Celery's delayed delivery does not route through a direct one.
    assert conf["task_default_exchange_type"] == "topic"
    for queue in conf["task_queues"]:
        assert queue.queue_arguments == {"x-queue-type": "quorum"} and queue.durable
        assert queue.exchange.type == "topic" and queue.routing_key == queue.name


@pytest.mark.parametrize("url", ["http://rabbit:15672/", "kafka://k:9092"])
def test_a_broker_url_of_another_kind_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError, match="PLAYRUN_BROKER_URL"):
        Settings(broker_url=url).check()


def test_a_countdown_on_rabbitmq_is_whole_seconds_never_less_than_one() -> None:
    assert [amqp_countdown(c) for c in (None, 0, 0.2, 1.0, 1.01, 29.5)] == [
        None, 0, 1.0, 1.0, 2.0, 30.0]


@pytest.fixture
def app() -> Iterator[object]:
    from tasks.broker.app import create_app
    from tasks.settings import get_settings

    celery_app = create_app()
    yield celery_app
    rebind(celery_app, get_settings())


def test_rebind_moves_a_running_app_to_the_other_broker(app: object) -> None:
    from celery import Celery

    assert isinstance(app, Celery)
    assert app.amqp.queues[QUEUE].queue_arguments is None  # built for Redis
    rebind(app, Settings(redis_url="redis://127.0.0.1:6379/4", broker_url=AMQP))
    assert app.conf.broker_url == AMQP and app.conf.result_backend == "redis://127.0.0.1:6379/4"
    assert app.amqp.queues[QUEUE].queue_arguments == {"x-queue-type": "quorum"}
    assert app.conf.broker_transport is None
    rebind(app, Settings(redis_url="redis://127.0.0.1:6379/4", broker_url=""))
    assert app.amqp.queues[QUEUE].queue_arguments is None
    assert app.conf.broker_transport == REDIS_TRANSPORT
