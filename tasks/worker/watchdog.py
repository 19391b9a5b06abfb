"""A worker liveness watchdog: exit when the consumer has silently stopped consuming.

Celery workers on Redis can stay alive but stop consuming after a broker restart
(celery/celery#8091, #8030, #10205). Every few seconds the watchdog publishes a ping
to this worker's own direct queue; if pings publish fine but none is received for
the threshold, the worker exits so its supervisor starts a fresh one. Nothing is
lost: late acks redeliver, and the reaper adopts attempts whose lease runs out.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from celery import bootsteps
from celery.signals import task_received
from celery.utils.nodenames import worker_direct
from celery.worker import state as worker_state

from tasks.constants import TASK_WATCHDOG_PING
from tasks.settings import get_settings

log = logging.getLogger("playrun.watchdog")
_last_received = time.monotonic()


@task_received.connect
def _note_ping(sender: Any = None, request: Any = None, **_: Any) -> None:
    global _last_received
    if request is not None and getattr(request, "name", None) == TASK_WATCHDOG_PING:
        _last_received = time.monotonic()


@dataclass
class Judge:
    """The watchdog's decision, kept pure: given what happened, is the consumer wedged?"""

    threshold_s: float
    capacity: int  # prefetch slots; 0 if unknown
    published_since: float | None = None  # first ping published since the last reset

    def verdict(self, *, now: float, published: bool, last_received: float,
                reserved: int) -> str:
        if not published:
            # The broker is down: nothing to judge until it answers again.
            self.published_since = None
            return "broker_down"
        if self.capacity and reserved >= self.capacity:
            # Every prefetch slot holds an unacked task: the consumer may not receive
            # anything, pings included. That is busy, not wedged.
            self.published_since = None
            return "busy"
        if self.published_since is None:
            self.published_since = now
        silent = now - max(last_received, self.published_since)
        return "wedged" if silent > self.threshold_s else "ok"


class BrokerWatchdog(bootsteps.StartStopStep):
    """Consumer bootstep: the ping loop runs in a daemon thread of the main process."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.threshold = get_settings().worker_watchdog_s
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, parent: Any) -> None:
        if self.threshold <= 0 or self.thread is not None:
            return
        capacity = int(getattr(parent, "initial_prefetch_count", 0) or 0)
        self.thread = threading.Thread(target=self._loop,
                                       args=(parent.app, parent.hostname, capacity),
                                       name="playrun-watchdog", daemon=True)
        self.thread.start()

    def stop(self, parent: Any) -> None:
        # The consumer restarts this step on every reconnect: keep one loop for the process.
        pass

    def shutdown(self, parent: Any) -> None:
        self.stop_event.set()

    def _loop(self, app: Any, hostname: str, capacity: int) -> None:
        global _last_received
        every = max(0.5, self.threshold / 6)
        queue = worker_direct(hostname)
        judge = Judge(self.threshold, capacity)
        _last_received = time.monotonic()
        while not self.stop_event.wait(every):
            try:
                app.send_task(TASK_WATCHDOG_PING, queue=queue, expires=self.threshold,
                              retry=False)
                published = True
            except Exception as exc:  # noqa: BLE001 - broker down: nothing to judge yet
                log.info("watchdog ping not published (%s); waiting for the broker", exc)
                published = False
            verdict = judge.verdict(now=time.monotonic(), published=published,
                                    last_received=_last_received,
                                    reserved=len(worker_state.reserved_requests))
            if verdict == "wedged":
                log.critical("the broker answers but this worker received nothing for %.0fs; "
                             "exiting so a fresh worker takes over", self.threshold)
                _exit_soon()
                return


def _exit_soon(grace_s: float = 20.0) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)  # a wedged warm shutdown must not keep the process alive
    os._exit(75)
