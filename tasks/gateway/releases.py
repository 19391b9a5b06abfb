"""Releases sent in batches: one release_attempts task per host queue and window.

A pushed terminal hands its release (sandbox delete, capacity, receipts) to a worker.
One task per run cost a Celery message, a prefork round trip and an ack per run; under
load the runs that settle within one window share a task instead. A release waits at
most one window before it is sent, and a quiet gateway sends each at once (the window
only starts with the first release). A send that fails is logged: the reaper releases
what an ended attempt still holds once `release_grace_s` has passed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from tasks.constants import RELEASE_BATCH_MAX, TASK_RELEASE_ATTEMPTS
from tasks.release.batch import Holder

log = logging.getLogger("playrun.gateway.releases")

Send = Callable[[str, list[Any], str], None]  # (task name, args, queue)
_STOP = object()


class ReleaseBatcher:
    def __init__(self, send: Send, window_s: float) -> None:
        self.send = send
        self.window_s = window_s
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, holder: Holder, queue_name: str,
            sandbox: tuple[str, str, str] | None = None) -> None:
        """Queue one attempt's release for the worker that reaches its sandbox; `sandbox`
        (resource id, provider, sandbox id), when the terminal's write read its only one,
        goes with it."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="playrun-releases",
                                                daemon=True)
                self._thread.start()
        self._queue.put((queue_name, holder, sandbox))

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued, then stop (the gateway's shutdown)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(timeout_s)

    def _loop(self) -> None:
        stopping, last_send = False, float("-inf")
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            # Wait out the rest of the window since the last send, taking what arrives.
            until = last_send + self.window_s
            while len(batch) < RELEASE_BATCH_MAX:
                try:
                    item = self._queue.get(timeout=max(0.0, until - time.monotonic()))
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)
            last_send = time.monotonic()
            self._send(batch)

    def _send(self, batch: list[tuple[str, Holder, tuple[str, str, str] | None]]) -> None:
        by_queue: dict[str, list[list[Any]]] = {}
        for queue_name, holder, sandbox in batch:
            by_queue.setdefault(queue_name, []).append(
                [*holder, list(sandbox)] if sandbox else list(holder))
        for queue_name, holders in by_queue.items():
            try:
                self.send(TASK_RELEASE_ATTEMPTS, [holders], queue_name)
            except Exception as exc:  # noqa: BLE001 - the reaper releases them later
                log.warning("%d release(s) for %s not sent (%s); the reaper will release "
                            "them", len(holders), queue_name, exc)
