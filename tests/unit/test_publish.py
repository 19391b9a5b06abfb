"""The publisher seam: every task message goes through the current Publisher, and a stub
records what would have been sent without a broker."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

import tasks
from models import Outbox
from tasks.admission import relay
from tasks.broker import publish
from tasks.broker.app import app
from tasks.broker.publish import CeleryPublisher, Sent, StubPublisher, send, stubbed
from tasks.constants import QUEUE, TASK_CANCEL_ATTEMPT, TASK_START_ATTEMPT
from tasks.store.db import session_scope
from tests.support.paths import NOOP


def test_the_real_publisher_is_the_celery_apps_until_another_is_used() -> None:
    real = publish.publisher()
    assert isinstance(real, CeleryPublisher) and real.app is app
    with stubbed() as stub:
        assert publish.publisher() is stub
        send(TASK_CANCEL_ATTEMPT, ["r1"], "host-q")
    assert publish.publisher() is real
    assert stub.sent == [
        Sent(TASK_CANCEL_ATTEMPT, ["r1"], {"task_id": None, "countdown": None}, "host-q")
    ]


def test_a_submitted_run_sends_its_start_with_the_outbox_id(
    sqlite_db: str, published: StubPublisher, fifo: None
) -> None:
    handle = tasks.submit_run(NOOP, {"n": 1}, org_id="pub")
    with session_scope(readonly=True) as s:
        outbox_id = s.scalar(sa.select(Outbox.id).where(Outbox.run_id == handle.id))
    assert published.sent == [
        Sent(TASK_START_ATTEMPT, [handle.id], {"task_id": outbox_id, "countdown": None}, QUEUE)
    ]


def test_a_broker_error_leaves_the_start_to_the_sweep(
    sqlite_db: str, published: StubPublisher, fifo: None
) -> None:
    published.fail = ConnectionError("broker down")
    handle = tasks.submit_run(NOOP, org_id="pub")
    assert published.sent == []
    published.fail = None
    assert relay.publish_due() == 1
    assert published.names() == [TASK_START_ATTEMPT]
    assert published.sent[0].args == [handle.id]
    assert relay.publish_due() == 0  # sent once


def test_the_stub_never_sees_a_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app, "send_task", None)  # any real send would raise TypeError
    with stubbed() as stub:
        stub.send("t", [1], countdown=2.5, task_id="x")
        stub.send_many([("id1", "t", [2])], "q")
    assert [(s.args, s.kwargs, s.queue) for s in stub.sent] == [
        ([1], {"task_id": "x", "countdown": 2.5}, QUEUE),
        ([2], {"task_id": "id1", "countdown": None}, "q"),
    ]
    assert stub.oldest_waiting() is None


def test_in_fair_order_a_relay_without_redis_leaves_the_start_to_the_sweep(
    sqlite_db: str, published: StubPublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.settings import reset_settings

    monkeypatch.setenv("PLAYRUN_START_ORDER", "fair")
    monkeypatch.setenv("PLAYRUN_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens
    reset_settings()
    handle = tasks.submit_run(NOOP, org_id="pub")
    assert not handle.published and published.sent == []
    with session_scope(readonly=True) as s:
        row = s.execute(sa.select(Outbox.org_id, Outbox.sent_at)
                        .where(Outbox.run_id == handle.id)).one()
    assert tuple(row) == ("pub", None)  # committed, waiting in the outbox for its turn
