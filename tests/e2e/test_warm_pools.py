"""Warm pools end to end: real workers with beat, the gateway, the local provider."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import tasks
from models import PoolMember
from tasks.acquisition.pools import config, view
from tasks.store.db import session_scope
from tests.support.env import SANDBOX_ROOT
from tests.support.helpers import eventually, kinds
from tests.support.paths import ROOT
from tests.support.stack import Worker

pytestmark = pytest.mark.slow
HELLO = ROOT / "examples" / "plays" / "hello.py"


def org() -> str:
    return f"org-{uuid.uuid4().hex[:8]}"


def members(state: str | None = None) -> list[Any]:
    with session_scope(readonly=True) as session:
        q = sa.select(PoolMember)
        if state:
            q = q.where(PoolMember.state == state)
        return list(session.scalars(q).all())


def ready() -> int:
    return view.states().get("default", {}).get("ready", 0)


@pytest.fixture
def pool(worker: Worker) -> Iterator[config.Pool]:
    made = config.set_pool(config.build("default", 2, 3, "10m", "local"))
    eventually(lambda: ready() >= 2, timeout=60, what="two warm sandboxes")
    yield made
    config.remove_pool("default")
    eventually(lambda: not members("ready") and not members("retiring"), timeout=60,
               what="the pool's sandboxes deleted")


def test_a_run_takes_a_warm_sandbox_and_the_pool_refills(pool: config.Pool) -> None:
    before = {m.sandbox_id for m in members("ready")}
    handle = tasks.submit_run(HELLO, input={"name": "Ada"}, org_id=org())
    result = handle.wait(timeout=60)
    assert result.status == "succeeded", result
    assert result.output == {"greeting": "Hello, Ada!", "shout": "ADA"}
    sandbox = tasks.get_run(handle.id).attempts[0].sandbox_id
    assert sandbox in before
    seq = kinds(handle.id)
    assert "pool.claimed" in seq and "sandbox.requested" not in seq
    eventually(lambda: "sandbox.deleted" in kinds(handle.id), what="the sandbox deleted")
    assert not (SANDBOX_ROOT / sandbox).exists()
    eventually(lambda: ready() >= 2, timeout=30, what="the pool refilled")
    assert sandbox not in {m.sandbox_id for m in members("ready")}
