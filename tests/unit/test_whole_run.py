"""A whole run inside the test process on SQLite: the worker's start task, the `fake`
provider's hosted runner (tasks/sandbox/fake_runners.py) speaking the real protocol to
the gateway served from a thread, and the release the gateway asks for."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import tasks
from models import CapacityLease
from tasks.broker.publish import StubPublisher
from tasks.constants import TASK_CANCEL_ATTEMPT, TASK_RELEASE_ATTEMPTS
from tasks.sandbox.fake import FakeScript
from tasks.sandbox.fake_runners import host
from tasks.settings import get_settings, reset_settings
from tasks.store.db import session_scope
from tasks.worker import jobs
from tests.support.helpers import eventually
from tests.support.paths import NOOP
from tests.support.units import ServedGateway, served_gateway


@pytest.fixture
def stack(fake_stack: FakeScript, published: StubPublisher,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[ServedGateway]:
    """The gateway, and a runner host for the fake sandboxes, both in threads."""
    with served_gateway() as gateway:
        monkeypatch.setenv("PLAYRUN_GATEWAY_URL", gateway.url)
        monkeypatch.setenv("PLAYRUN_GATEWAY_SOCKET", "/nonexistent/gateway.sock")
        reset_settings()
        loop = asyncio.new_event_loop()
        stop = asyncio.Event()
        thread = threading.Thread(target=loop.run_until_complete,
                                  args=(hosted(Path(get_settings().sandbox_root), stop),),
                                  daemon=True)
        thread.start()
        try:
            yield gateway
        finally:
            loop.call_soon_threadsafe(stop.set)
            thread.join(10)
            loop.close()


async def hosted(root: Path, stop: asyncio.Event) -> None:
    """The runner host until `stop`, then every run it hosts is ended too."""
    hosting = asyncio.create_task(host(root))
    await stop.wait()
    others = asyncio.all_tasks() - {asyncio.current_task()}
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
    assert hosting.done()


def lease_states(run_id: str) -> list[str]:
    with session_scope() as s:
        return list(s.scalars(sa.select(CapacityLease.state)
                              .where(CapacityLease.run_id == run_id)))


def test_a_run_succeeds_with_its_progress_and_is_released(
        stack: ServedGateway, published: StubPublisher) -> None:
    fake = {"fake": {"progress": 3, "output": {"answer": 42}}}
    handle = tasks.submit_run(NOOP, fake, org_id="whole")
    assert jobs.start_attempt(handle.id) == "launched"
    view = eventually(lambda: (v := tasks.get_run(handle.id)).status == "succeeded" and v,
                      what="the run's terminal")
    assert view.output == {"answer": 42}
    progress = [e for e in tasks.run_events(handle.id) if e.kind == "run.progress"]
    assert [e.data["fields"]["i"] for e in progress] == [0, 1, 2]
    (release,) = eventually(lambda: [s for s in stack.sent if s[0] == TASK_RELEASE_ATTEMPTS],
                            what="the release the gateway sends")
    assert lease_states(handle.id) == ["live"]  # held until the release runs
    jobs.release_attempts_task(*release[1])
    assert lease_states(handle.id) == ["released"]


def test_a_cancelled_running_run_frees_its_sandbox_and_lease(
        stack: ServedGateway, published: StubPublisher) -> None:
    handle = tasks.submit_run(NOOP, {"fake": {"hang": True}}, org_id="whole")
    assert jobs.start_attempt(handle.id) == "launched"
    sandbox = Path(get_settings().sandbox_root) / str(tasks.get_run(handle.id).attempts[-1]
                                                      .sandbox_id)
    assert sandbox.is_dir()
    published.sent.clear()
    tasks.cancel_run(handle.id)
    (cancel,) = [m for m in published.sent if m.name == TASK_CANCEL_ATTEMPT]
    jobs.cancel_attempt(*cancel.args)
    view = tasks.get_run(handle.id)
    assert (view.status, view.code) == ("cancelled", "CANCELLED")
    assert lease_states(handle.id) == ["released"]
    assert not sandbox.exists()
