"""The release after a pushed terminal (release_attempt): sandbox deleted, then receipts
(when the attempt holds any), then its capacity lease, each recorded once and in that
order, however often the release is delivered."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from models import CapacityLease, RuntimeResource, WorkReceipt
from tasks.release.attempt import release_attempt, release_attempts
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle_launch
from tasks.store.db import session_scope
from tasks.store.fence import LaunchFence
from tests.support.runs import ORG_PREFIX, close_open_runs, event_kinds, launched


@pytest.fixture(scope="module", autouse=True)
def _no_open_runs_left(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)  # no later module's reaper adopts what these left open


def states(run_id: str) -> tuple[list[str], list[str], list[str]]:
    with session_scope() as s:
        return (list(s.scalars(sa.select(RuntimeResource.state)
                               .where(RuntimeResource.run_id == run_id))),
                list(s.scalars(sa.select(CapacityLease.state)
                               .where(CapacityLease.run_id == run_id))),
                list(s.scalars(sa.select(WorkReceipt.status)
                               .where(WorkReceipt.owner_run_id == run_id))))


def hold_receipt(fence: LaunchFence) -> None:
    with session_scope() as s:
        s.add(WorkReceipt(receipt_key=uuid.uuid4().hex, org_id="o", play="p", step_key="k",
                          status="running", owner_run_id=fence.run_id,
                          owner_generation=fence.generation, owner_launch_id=fence.launch_id,
                          claim_id="c1"))


def test_without_receipts_the_sandbox_then_the_lease_go_back_once(pg_url: str) -> None:
    fence, token = launched()
    assert settle_launch(fence, Outcome("succeeded", output={})).won
    release_attempt(fence.run_id, fence.generation, token)
    release_attempt(fence.run_id, fence.generation, token)  # a redelivery changes nothing
    assert event_kinds(fence.run_id)[-3:] == ["run.succeeded", "sandbox.deleted",
                                              "capacity.released"]
    assert event_kinds(fence.run_id).count("capacity.released") == 1
    assert states(fence.run_id) == (["deleted"], ["released"], [])


def test_held_receipts_go_back_before_the_lease(pg_url: str) -> None:
    fence, token = launched()
    hold_receipt(fence)
    assert settle_launch(fence, Outcome("failed", "PLAY_ERROR", "it raised")).won
    release_attempt(fence.run_id, fence.generation, token)
    assert event_kinds(fence.run_id)[-4:] == ["run.failed", "sandbox.deleted",
                                              "receipts.released", "capacity.released"]
    assert states(fence.run_id) == (["deleted"], ["released"], ["released"])


def test_another_holders_token_releases_nothing(pg_url: str) -> None:
    fence, _ = launched()
    assert settle_launch(fence, Outcome("succeeded", output={})).won
    release_attempt(fence.run_id, fence.generation, "not-the-holder")
    assert "sandbox.deleted" not in event_kinds(fence.run_id)
    assert states(fence.run_id) == (["live"], ["live"], [])


def test_a_batch_releases_each_holder_as_one_by_one_would(pg_url: str) -> None:
    """release_attempts with several holders shares two statements between them (one
    read, one mark-and-release): each holder's rows and events come out as one release
    of its own would leave them, a holder with receipts and one given twice included."""
    plain, held, twice = launched(), launched(), launched()
    stranger, _ = launched()
    hold_receipt(held[0])
    for fence, _token in (plain, held, twice):
        assert settle_launch(fence, Outcome("succeeded", output={})).won
    assert settle_launch(stranger, Outcome("succeeded", output={})).won
    batch = [[plain[0].run_id, 1, plain[1]], [held[0].run_id, 1, held[1]],
             [twice[0].run_id, 1, twice[1]], [twice[0].run_id, 1, twice[1]],
             [stranger.run_id, 1, "not-the-holder"]]
    assert release_attempts(batch) == 5
    assert release_attempts(batch) == 5  # a redelivery changes nothing
    for fence, _token in (plain, twice):
        assert event_kinds(fence.run_id)[-3:] == ["run.succeeded", "sandbox.deleted",
                                                  "capacity.released"]
        assert states(fence.run_id) == (["deleted"], ["released"], [])
    assert event_kinds(held[0].run_id)[-4:] == ["run.succeeded", "sandbox.deleted",
                                                "receipts.released", "capacity.released"]
    assert states(held[0].run_id) == (["deleted"], ["released"], ["released"])
    assert "sandbox.deleted" not in event_kinds(stranger.run_id)
    assert states(stranger.run_id) == (["live"], ["live"], [])
