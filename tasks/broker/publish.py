"""The one way playrun sends a task message: a `Publisher`.

The real one is the Celery app's (kombu's producer, or the lean Redis publish for a
batch; on RabbitMQ always kombu's producer, with publisher confirms); `StubPublisher`
records what would have been sent, in memory, so tests of the code that publishes need
no broker. `use()` swaps the current one; nothing here closes
or replaces the app's connection pools, which are process-wide.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from tasks.broker.message import Message as Message  # re-exported for callers
from tasks.constants import QUEUE


class Publisher(Protocol):
    def send(
        self,
        name: str,
        args: list[Any],
        *,
        queue: str = QUEUE,
        task_id: str | None = None,
        countdown: float | None = None,
    ) -> None:
        """One task message; raises on a broker error."""

    def send_many(self, messages: Sequence[Message], queue: str = QUEUE) -> None:
        """Every message or raise (the caller leaves them to the outbox sweep)."""

    def oldest_waiting(self, queue: str = QUEUE) -> str | None:
        """The task id of the oldest message still waiting on `queue`, when known."""

    def waiting(self, queues: Sequence[str]) -> int:
        """Messages waiting on `queues` in all (0 when the broker does not say)."""


class CeleryPublisher:
    """Sends through a Celery app (the process's own unless given)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def send(
        self,
        name: str,
        args: list[Any],
        *,
        queue: str = QUEUE,
        task_id: str | None = None,
        countdown: float | None = None,
    ) -> None:
        from tasks.broker.app import queue as direct_queue
        from tasks.broker.config import amqp_countdown, is_amqp

        if countdown and is_amqp(str(self.app.conf.broker_url or "")):
            from tasks.broker.rabbit import ensure_delayed

            ensure_delayed(self.app, queue)
            countdown = amqp_countdown(countdown)
        self.app.send_task(
            name,
            args=args,
            queue=direct_queue(queue),
            task_id=task_id,
            countdown=countdown,
            ignore_result=True,
        )

    def send_many(self, messages: Sequence[Message], queue: str = QUEUE) -> None:
        from tasks.broker import lean

        lean.send_tasks(self.app, messages, queue)

    def oldest_waiting(self, queue: str = QUEUE) -> str | None:
        from tasks.broker import lean

        return lean.oldest_waiting(self.app, queue)

    def waiting(self, queues: Sequence[str]) -> int:
        from tasks.broker import lean

        return lean.queue_length(self.app, queues)


@dataclass(frozen=True)
class Sent:
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str


@dataclass
class StubPublisher:
    """Records every message instead of sending it; `fail` makes each send raise it."""

    sent: list[Sent] = field(default_factory=list)
    fail: Exception | None = None

    def send(
        self,
        name: str,
        args: list[Any],
        *,
        queue: str = QUEUE,
        task_id: str | None = None,
        countdown: float | None = None,
    ) -> None:
        if self.fail is not None:
            raise self.fail
        self.sent.append(
            Sent(name, list(args), {"task_id": task_id, "countdown": countdown}, queue)
        )

    def send_many(self, messages: Sequence[Message], queue: str = QUEUE) -> None:
        if self.fail is not None:
            raise self.fail
        for task_id, name, args in messages:
            self.sent.append(Sent(name, list(args), {"task_id": task_id, "countdown": None}, queue))

    def oldest_waiting(self, queue: str = QUEUE) -> str | None:
        return None

    def waiting(self, queues: Sequence[str]) -> int:
        return 0  # nothing it records is ever taken: no queue to count

    def names(self) -> list[str]:
        return [s.name for s in self.sent]


_current: Publisher | None = None


def publisher() -> Publisher:
    """The publisher in use: the Celery app's unless `use()` set another."""
    global _current
    if _current is None:
        from tasks.broker.app import app

        _current = CeleryPublisher(app)
    return _current


def use(new: Publisher | None) -> Publisher | None:
    """Make `new` the publisher (None: the Celery app's again); returns the previous one."""
    global _current
    previous, _current = _current, new
    return previous


@contextmanager
def stubbed() -> Iterator[StubPublisher]:
    """A StubPublisher in use for the block; the previous publisher afterwards."""
    stub = StubPublisher()
    previous = use(stub)
    try:
        yield stub
    finally:
        use(previous)


def send(name: str, args: list[Any], queue_name: str = QUEUE) -> None:
    """One task message through the current publisher."""
    publisher().send(name, args, queue=queue_name)
