"""Recording a sandbox live is idempotent for the same intact attempt (a provider retry
re-reports it) and a fence loss for anyone else."""

from __future__ import annotations

import time
import uuid

import pytest
import sqlalchemy as sa

from models import CapacityLease, RuntimeResource
from tasks.acquisition import capacity
from tasks.acquisition.sandbox import record_live
from tasks.errors import FenceLostError
from tasks.sandbox import SandboxRef
from tasks.store import ledger
from tasks.store.db import session_scope
from tasks.store.fence import Fence
from tests.support.runs import must_claim, new_run, reserve


def claimed_run() -> tuple[Fence, str]:
    org = f"org-{uuid.uuid4().hex[:8]}"
    fence = must_claim(new_run(org), "t")
    return fence, reserve(fence, org)


def ref(sandbox_id: str) -> SandboxRef:
    return SandboxRef("fake", sandbox_id, {"playrun": "1"}, time.time())


def promoter(fence: Fence, lease_id: str):  # type: ignore[no-untyped-def]
    return lambda session, r: capacity.promote(session, fence, lease_id, r.provider, r.sandbox_id)


def test_same_sandbox_same_attempt_twice_is_success_once_in_the_ledger(pg_url: str) -> None:
    f, lease = claimed_run()
    sid = f"fsb-{uuid.uuid4().hex[:12]}"
    record_live(f, ref(sid), promoter(f, lease))
    record_live(f, ref(sid), promoter(f, lease))
    with session_scope() as s:
        live = [e for e in ledger.read(s, f.run_id) if e.kind == "sandbox.live"]
        rows = s.scalars(sa.select(RuntimeResource).where(
            RuntimeResource.run_id == f.run_id)).all()
        state = s.scalar(sa.select(CapacityLease.state).where(CapacityLease.id == lease))
    assert len(live) == 1 and len(rows) == 1 and state == "live"


def test_another_sandbox_or_a_stale_token_is_a_fence_loss(pg_url: str) -> None:
    f, lease = claimed_run()
    first = f"fsb-{uuid.uuid4().hex[:12]}"
    record_live(f, ref(first), promoter(f, lease))
    other = f"fsb-{uuid.uuid4().hex[:12]}"
    with pytest.raises(FenceLostError):
        record_live(f, ref(other), promoter(f, lease))
    stale = Fence(f.run_id, f.generation, "not-the-token")
    with pytest.raises(FenceLostError):
        record_live(stale, ref(first), promoter(stale, lease))
    with session_scope() as s:
        states = dict(s.execute(sa.select(RuntimeResource.sandbox_id, RuntimeResource.state)
                                .where(RuntimeResource.run_id == f.run_id)).all())
    assert states == {first: "live", other: "cleanup"}
