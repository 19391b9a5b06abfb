"""The Redis transport playrun's workers use: kombu's, with one command client per pool."""

from __future__ import annotations

import uuid

from kombu import Connection

from tasks.broker.app import app
from tasks.broker.transport import Channel, SentinelTransport, Transport


def test_the_app_uses_it_and_a_channel_keeps_one_client_per_pool() -> None:
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, Transport)
        channel = conn.default_channel
        assert isinstance(channel, Channel)
        first = channel._create_client()
        assert channel._create_client() is first
        key = "playrun-test-transport-" + uuid.uuid4().hex
        first.set(key, "1", ex=60)
        channel._disconnect_pools()  # as after a fork or a lost connection
        second = channel._create_client()
        assert second is not first and second.connection_pool is channel.pool
        assert second.get(key) == b"1"
        assert channel._create_client(asynchronous=True) is not second


def test_a_message_round_trips_and_its_ack_clears_the_unacked_record() -> None:
    queue = "playrun-test-transport-" + uuid.uuid4().hex
    with app.connection_for_write() as conn:
        q = conn.SimpleQueue(queue)
        try:
            q.put({"n": 1})
            message = q.get(timeout=5)
            assert message.payload == {"n": 1}
            client = conn.default_channel._create_client()
            unacked = conn.default_channel.unacked_key
            assert client.hexists(unacked, message.delivery_tag)
            message.ack()
            assert not client.hexists(unacked, message.delivery_tag)
        finally:
            q.close()


def test_a_sentinel_connection_keeps_its_transport_when_it_moves_to_the_next_sentinel(
        ) -> None:
    """A lost connection makes kombu switch to the next URL of the list: the transport
    stays playrun's (its pools follow the primary), not the scheme's stock one."""
    urls = "sentinel://127.0.0.1:26379/0;sentinel://127.0.0.1:26380/0"
    conn = Connection(urls, transport=SentinelTransport,
                      transport_options={"master_name": "m"})
    assert isinstance(conn.transport, SentinelTransport)
    conn.maybe_switch_next()
    assert conn.port == 26380 and isinstance(conn.transport, SentinelTransport)
