"""Periodic jobs work in bounded batches: a backlog is taken a batch per pass."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from models import CapacityLease, Outbox, db_now, new_id
from tasks.admission import relay
from tasks.broker.publish import StubPublisher
from tasks.maintenance.reaper import expire_reservations
from tasks.store.db import session_scope
from tests.support.runs import close_open_runs, new_run

ORG = "batches-"


def _expired_reservations(run_id: str, n: int) -> None:
    with session_scope() as s:
        s.execute(sa.insert(CapacityLease).values(expires_at=db_now(-60)), [
            {"id": new_id(), "org_id": ORG + "cap", "run_id": run_id, "generation": 1,
             "state": "reserved", "holder_token": "t", "overrun": False} for _ in range(n)])


def _held(run_id: str) -> int:
    with session_scope(readonly=True) as s:
        return int(s.scalar(sa.select(sa.func.count()).select_from(CapacityLease).where(
            CapacityLease.run_id == run_id, CapacityLease.state == "reserved")) or 0)


def test_expired_reservations_go_a_batch_per_pass(pg_url: str) -> None:
    run_id = new_run(ORG + uuid.uuid4().hex[:6])
    _expired_reservations(run_id, 7)
    assert expire_reservations(limit=5) == 5 and _held(run_id) == 2
    assert expire_reservations(limit=5) == 2 and _held(run_id) == 0
    assert expire_reservations(limit=5) == 0
    close_open_runs(ORG)


def test_the_sweep_publishes_a_batch_per_pass(pg_url: str, published: StubPublisher) -> None:
    runs = [new_run(ORG + uuid.uuid4().hex[:6]) for _ in range(5)]
    with session_scope() as s:  # new_run marked them sent: make them due again
        s.execute(sa.update(Outbox).where(Outbox.run_id.in_(runs)).values(sent_at=None))
    with session_scope(readonly=True) as s:
        ids = list(s.scalars(sa.select(Outbox.id).where(Outbox.run_id.in_(runs))))
    assert relay.publish_due(ids=ids, limit=3) == 3
    assert relay.publish_due(ids=ids, limit=3) == 2
    assert relay.publish_due(ids=ids, limit=3) == 0
    assert sorted(m.args[0] for m in published.sent) == sorted(runs)
    close_open_runs(ORG)
