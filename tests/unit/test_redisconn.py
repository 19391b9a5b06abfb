"""Redis URLs: the forms playrun reads and what Celery is given for each."""

from __future__ import annotations

import pytest

from tasks.errors import ConfigurationError
from tasks.settings import Settings
from tasks.store import redisconn


def test_urls_translate_for_celery_and_redis_py() -> None:
    url = "redis+sentinel://u:p%40ss@127.0.0.1:26379,127.0.0.1:26380/playrun/2"
    target = redisconn.parse(url)
    assert (target.kind, target.service, target.db) == ("sentinel", "playrun", 2)
    assert target.nodes == (("127.0.0.1", 26379), ("127.0.0.1", 26380))
    assert target.credentials == {"username": "u", "password": "p@ss"}
    celery = redisconn.celery_settings(url)
    assert celery["broker_url"] == ("sentinel://u:p%40ss@127.0.0.1:26379/2;"
                                    "sentinel://u:p%40ss@127.0.0.1:26380/2")
    assert celery["transport_options"] == {"master_name": "playrun"}
    assert celery["transport"] == "tasks.broker.transport:SentinelTransport"
    assert redisconn.redact(url) == "redis+sentinel://u:***@127.0.0.1:26379,127.0.0.1:26380/playrun/2"


def test_a_cluster_url_has_seed_nodes_only() -> None:
    target = redisconn.parse("redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
    assert (target.kind, target.nodes) == ("cluster", (("127.0.0.1", 7000), ("127.0.0.1", 7001)))
    with pytest.raises(ConfigurationError, match="no database number"):
        redisconn.parse("redis+cluster://127.0.0.1:7000/0")


@pytest.mark.parametrize("url, says", [
    ("sentinel://127.0.0.1:26379", "redis\\+sentinel://"),
    ("redis+sentinel://127.0.0.1:26379", "service/db"),
    ("redis+sentinel://127.0.0.1:26379/svc/x", "service/db"),
    ("redis+sentinel://127.0.0.1:notaport/svc", "not host:port"),
])
def test_bad_urls_say_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        redisconn.parse(url)


def test_the_broker_url_cannot_be_a_cluster() -> None:
    with pytest.raises(ConfigurationError, match="PLAYRUN_START_RATE_REDIS_URL"):
        Settings(redis_url="redis+cluster://127.0.0.1:7000").check()
    ok = Settings(start_rate_redis_url="redis+cluster://127.0.0.1:7000").check()
    assert ok.start_rate_redis_url is not None


def test_plain_and_other_urls_pass_through_to_celery() -> None:
    plain = redisconn.celery_settings("redis://127.0.0.1:6379/3")
    assert plain["broker_url"] == plain["result_backend"] == "redis://127.0.0.1:6379/3"
    assert plain["transport"] == "tasks.broker.transport:Transport"
    other = redisconn.celery_settings("memory://")
    assert (other["broker_url"], other["transport"]) == ("memory://", None)
