"""Fair order: a start goes out at admission, skipping the outbox's queue, only while no
start waits; otherwise it waits for its org's turn. On a real Redis broker with no worker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis
import sqlalchemy as sa

import tasks
from models import Outbox
from tasks.acquisition.fairshare import relay as fair_relay
from tasks.constants import QUEUE
from tasks.settings import reset_settings
from tasks.store.db import session_scope
from tests.support.paths import ROOT
from tests.support.runs import close_open_runs

NOOP = ROOT / "examples" / "plays" / "noop.py"
ORG = "skip-"


@pytest.fixture
def fair(pg_url: str, redis_client: redis.Redis[bytes]) -> Iterator[redis.Redis[bytes]]:
    """An empty queue and a fresh fair order (what earlier tests left is not ours)."""
    redis_client.delete(QUEUE)
    keys = fair_relay.store().keys
    redis_client.delete(*vars(keys).values())
    yield redis_client
    redis_client.delete(*vars(keys).values())
    close_open_runs(ORG)


def _row(run_id: str) -> tuple[bool, int, str]:
    with session_scope(readonly=True) as s:
        sent, count, outbox_id = s.execute(
            sa.select(Outbox.sent_at.is_not(None), Outbox.publish_count, Outbox.id)
            .where(Outbox.run_id == run_id)).one()
    return bool(sent), int(count), str(outbox_id)


def _queued_ids(client: redis.Redis[bytes]) -> list[str]:
    return [json.loads(m)["headers"]["id"] for m in client.lrange(QUEUE, 0, -1)]


def test_with_no_start_waiting_the_admission_publishes_its_own_start(
        fair: redis.Redis[bytes]) -> None:
    fair_relay.store().note_backlog(False)  # as a pass that left nothing unsent notes it
    # No pass can run (another relay holds the lease): what goes out, the admission sent.
    assert fair_relay.store().lock("another relay", 10_000)
    handle = tasks.submit_run(NOOP, org_id=ORG + uuid.uuid4().hex[:6])
    sent, count, outbox_id = _row(handle.id)
    assert (sent, count) == (True, 1)  # written sent: no pass, no second write
    assert _queued_ids(fair) == [outbox_id]  # the message is the row, by its id
    assert fair_relay.store().inflight() == 1  # and counts in the window like a pass's


def test_while_starts_wait_a_new_one_takes_its_turn(fair: redis.Redis[bytes]) -> None:
    fair_relay.store().note_backlog(True)  # a pass left starts unsent
    # A pass is running elsewhere (its lease is held): this admission's start is left to it.
    assert fair_relay.store().lock("another relay", 10_000)
    handle = tasks.submit_run(NOOP, org_id=ORG + uuid.uuid4().hex[:6])
    assert _row(handle.id)[:2] == (False, 0)
    assert _queued_ids(fair) == []
    assert fair_relay.store().unlock("another relay")
    fair_relay.pump()  # the relay's turn: now it goes out, marked sent once
    sent, count, outbox_id = _row(handle.id)
    assert (sent, count) == (True, 1) and outbox_id in _queued_ids(fair)


def test_with_nothing_noted_yet_the_relay_decides(fair: redis.Redis[bytes]) -> None:
    """A fleet whose relay never ran (or whose Redis lost the note) trusts no guess."""
    handle = tasks.submit_run(NOOP, org_id=ORG + uuid.uuid4().hex[:6])
    sent, count, outbox_id = _row(handle.id)
    assert (sent, count) == (True, 1) and _queued_ids(fair) == [outbox_id]  # by a pass
    assert fair.hget(fair_relay.store().keys.tags, "~b") == b"0"  # which left none unsent


def test_where_full_orgs_wait_unpublished_no_start_skips(
        fair: redis.Redis[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """PLAYRUN_CAPACITY_FULL=defer: only a pass reads an org's room, so every start waits
    for one (a full org's start is never published to be deferred)."""
    monkeypatch.setenv("PLAYRUN_CAPACITY_FULL", "defer")
    reset_settings()
    try:
        fair_relay.store().note_backlog(False)
        assert fair_relay.store().lock("another relay", 10_000)
        handle = tasks.submit_run(NOOP, org_id=ORG + uuid.uuid4().hex[:6])
        assert _row(handle.id)[:2] == (False, 0) and _queued_ids(fair) == []
    finally:
        monkeypatch.undo()
        reset_settings()
