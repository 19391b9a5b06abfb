"""The sweep re-sends the start of a long-queued run only when its message can be lost:
a backlog still waiting in the broker is left alone, a broker that lost messages (the
oldest, or all of them) gets them again, on a real Redis broker with no worker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
import sqlalchemy as sa

import tasks
from models import Outbox
from tasks.admission import relay
from tasks.broker import lean
from tasks.broker.app import app
from tasks.constants import QUEUE
from tasks.settings import reset_settings
from tasks.store.db import session_scope
from tests.support.paths import ROOT
from tests.support.runs import close_open_runs

NOOP = ROOT / "examples" / "plays" / "noop.py"
ORG = "resend-"


@pytest.fixture(autouse=True)
def fifo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The FIFO relay's resend (the fair order gives stale rows back to the outbox)."""
    monkeypatch.setenv("PLAYRUN_START_ORDER", "fifo")
    reset_settings()
    yield
    monkeypatch.undo()
    reset_settings()


def _counts(run_ids: list[str]) -> list[int]:
    with session_scope(readonly=True) as s:
        rows = {run_id: count for run_id, count in s.execute(
            sa.select(Outbox.run_id, Outbox.publish_count).where(Outbox.run_id.in_(run_ids)))}
    return [rows[r] for r in run_ids]


def test_a_waiting_backlog_is_not_sent_again_and_lost_messages_are(
        pg_url: str, redis_client: redis.Redis[bytes]) -> None:
    redis_client.delete(QUEUE)  # what earlier tests left on the queue
    org = ORG + uuid.uuid4().hex[:6]
    runs = [tasks.submit_run(NOOP, org_id=org).id for _ in range(6)]
    with session_scope() as s:  # sent an hour ago: long past any resend wait
        s.execute(sa.update(Outbox).where(Outbox.run_id.in_(runs))
                  .values(sent_at=Outbox.sent_at - sa.text("interval '1 hour'")))
    assert lean.oldest_waiting(app) is not None
    relay.resend_stale(after_s=1)
    assert _counts(runs) == [1] * 6  # all six still wait in the broker, oldest first

    redis_client.rpop(QUEUE, 2)  # the broker lost the two oldest
    relay.resend_stale(after_s=1)
    assert _counts(runs) == [2, 2, 1, 1, 1, 1]

    redis_client.delete(QUEUE)  # the broker lost everything
    relay.resend_stale(after_s=1)
    assert _counts(runs) == [2, 2, 2, 2, 2, 2]  # the first two were just sent: not again
    assert redis_client.llen(QUEUE) >= 4  # their starts are in the broker again
    close_open_runs(ORG)


def test_a_message_that_is_not_a_task_sets_no_bound(
        pg_url: str, redis_client: redis.Redis[bytes]) -> None:
    """Then the resend behaves as it did without the broker's help: by age alone."""
    redis_client.delete(QUEUE)
    org = ORG + uuid.uuid4().hex[:6]
    run_id = tasks.submit_run(NOOP, org_id=org).id
    redis_client.rpush(QUEUE, b"not json")  # the oldest entry, and not a task's
    assert lean.oldest_waiting(app) is None
    with session_scope() as s:
        s.execute(sa.update(Outbox).where(Outbox.run_id == run_id)
                  .values(sent_at=Outbox.sent_at - sa.text("interval '1 hour'")))
    relay.resend_stale(after_s=1)
    assert _counts([run_id]) == [2]
    redis_client.delete(QUEUE)
    close_open_runs(ORG)
