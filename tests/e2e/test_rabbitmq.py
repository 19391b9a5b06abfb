"""The main flows on RabbitMQ (PLAYRUN_BROKER_URL=amqp://, this session's own vhost) with
a real gateway, worker and beat: a run succeeds, a cancel reaches the sandbox's host
queue, a killed worker's run is recovered and runs once, and a start the broker refused
stays in the outbox until the sweep sends it again. Results and buckets stay on Redis."""

from __future__ import annotations

import logging
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.constants import MAINTENANCE_QUEUE, QUEUE, RELEASE_QUEUE, TASK_WATCHDOG_PING
from tasks.testing import Stack, rabbitmq
from tasks.testing.roles import Worker
from tests.support.helpers import eventually
from tests.support.paths import PLAYS, ROOT
from tests.support.runs import FAST_RECOVERY, HOST_FILES
from tests.support.session import TEST_REDIS_URL, pg_database

pytestmark = pytest.mark.slow
HELLO = ROOT / "examples" / "plays" / "hello.py"


def org() -> str:
    return f"org-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def stack(rabbitmq_vhost: str) -> Iterator[Stack]:
    settings = {"PLAYRUN_BROKER_URL": rabbitmq.url(rabbitmq_vhost), **FAST_RECOVERY,
                **HOST_FILES, "PLAYRUN_OUTBOX_RESEND_AFTER_S": "2",
                # A wide fair window: a message left waiting never closes it.
                "PLAYRUN_START_RATE_INITIAL_PER_MIN": "6000",
                "PLAYRUN_START_RATE_MAX_PER_MIN": "6000",
                # The watchdog's pings go through the worker's own (classic) queue: a
                # worker that did not receive them would exit within the tests.
                "PLAYRUN_WORKER_WATCHDOG_S": "5"}
    with Stack(database=pg_database(f"playrun_test_amqp_{uuid.uuid4().hex[:8]}"),
               create_database=True, redis=TEST_REDIS_URL, settings=settings) as s:
        yield s


def worker_of(stack: Stack) -> Worker:
    return next(c for c in stack.children if isinstance(c, Worker))


def test_a_run_succeeds_through_quorum_queues(stack: Stack, rabbitmq_vhost: str) -> None:
    from tasks.sandbox.runtime import host_queue

    view = stack.run(HELLO, {"name": "Ada"}, org_id=org())
    assert view.status == "succeeded" and view.output == {"greeting": "Hello, Ada!",
                                                          "shout": "ADA"}
    eventually(lambda: "capacity.released" in [e.kind for e in stack.events(view.id)],
               what="release")
    with stack.bound():
        host = host_queue("local")
    queues = rabbitmq.queues(rabbitmq_vhost)
    # Every queue playrun declares is a quorum queue; the host's own one among them.
    for name in (QUEUE, MAINTENANCE_QUEUE, RELEASE_QUEUE, "playrun.provider.local", host):
        assert queues[name][0] == "quorum", (name, queues)
    # Nothing left waiting for the start: it was delivered and acked.
    assert queues[QUEUE][1] == 0


def test_a_cancel_reaches_the_play_through_its_host_queue(stack: Stack) -> None:
    handle = stack.submit(PLAYS / "forever.py", {}, org_id=org())
    with stack.bound():
        import tasks

        eventually(lambda: tasks.get_run(handle.id).sandbox_id and any(
            e.kind == "run.progress" for e in tasks.run_events(handle.id)),
            what="the play to start")
        sandbox = tasks.get_run(handle.id).sandbox_id
        assert sandbox and (stack.home / "sandboxes" / sandbox).exists()
        tasks.cancel_run(handle.id)
    view = stack.wait(handle, timeout=30)
    assert (view.status, view.code) == ("cancelled", "CANCELLED")
    eventually(lambda: "sandbox.deleted" in [e.kind for e in stack.events(handle.id)],
               what="the sandbox deleted on its host")
    assert not (stack.home / "sandboxes" / sandbox).exists()
    worker = worker_of(stack)
    assert worker.running and "received nothing" not in worker.output()


def test_a_killed_worker_s_run_is_recovered_and_runs_once(stack: Stack, tmp_path: Path
                                                          ) -> None:
    marker = tmp_path / "ran.txt"
    handle = stack.submit(PLAYS / "counter.py", {"path": str(marker), "seconds": 4},
                          org_id=org())
    eventually(marker.exists, what="the play to start")
    worker = worker_of(stack)
    worker.restart(signal.SIGKILL)  # the whole group, then a fresh worker of the same name
    view = stack.wait(handle, timeout=60)
    assert view.status == "succeeded" and view.output == {"ok": True}
    assert marker.read_text().count("\n") == 1, "the play ran more than once"
    assert [a.generation for a in view.attempts] == [1]
    eventually(lambda: "capacity.released" in [e.kind for e in stack.events(handle.id)],
               what="release")


def test_a_start_the_broker_refused_stays_in_the_outbox_and_is_sent_again(
    stack: Stack, rabbitmq_vhost: str, caplog: pytest.LogCaptureFixture
) -> None:
    from tasks.broker.publish import publisher

    worker = worker_of(stack)
    worker.stop()  # nothing takes from the start queue while the broker refuses it
    try:
        # The start queue is full at one message: the broker nacks every publish after it.
        rabbitmq.refuse_publishes(rabbitmq_vhost, QUEUE)
        with stack.bound():
            publisher().send(TASK_WATCHDOG_PING, [], queue=QUEUE)
            with caplog.at_level(logging.WARNING, logger="playrun.relay"):
                handle = stack.submit(HELLO, {"name": "Bo"}, org_id=org())
            assert "left to the sweep" in caplog.text
            # The run waits in the outbox, unsent: nothing was lost and nothing started.
            assert outbox_sent_at(handle.id) == [None]
        assert [e.kind for e in stack.events(handle.id)] == ["run.admitted"]
    finally:
        rabbitmq.allow_publishes(rabbitmq_vhost)
        worker.start().wait_ready()
    view = stack.wait(handle, timeout=60)  # the sweep sends it again, confirmed this time
    assert view.status == "succeeded"
    assert [a.generation for a in view.attempts] == [1]


def outbox_sent_at(run_id: str) -> list[object]:
    import sqlalchemy as sa

    from models import Outbox
    from tasks.store.db import session_scope

    with session_scope() as session:
        return list(session.scalars(sa.select(Outbox.sent_at).where(Outbox.run_id == run_id)))
