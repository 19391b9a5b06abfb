"""A dead token replayed from outside the fleet, in a process of its own at the lowest CPU
priority: an attacker's CPU is not the fleet's, so on a shared test host the replay gets
what the fleet leaves, and the gateway must answer all of it.

    python -m tests.support.replay URL TOKEN   (stops when its stdin closes)

Prints one JSON line when it stops: requests sent, the (status, code) pairs answered, and
any answer that mentions the run's outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from tasks.host.processes import die_with_parent
from tests.support.paths import ROOT

BODIES = [{"action": "heartbeat"},
          {"action": "complete", "result": {"status": "succeeded", "output": {"x": 1}}},
          {"action": "append_run_events", "idempotency_key": "l:1-1:0",
           "delivery_lease_owner": "runner:l", "dropped": 0,
           "events": [{"seq": 1, "message": "x", "fields": {}}]}]
CONNECTIONS = 4


@contextmanager
def replaying(url: str, token: str) -> Iterator[dict[str, Any]]:
    """Replay while the block runs; the summary dict is filled in when it ends."""
    summary: dict[str, Any] = {}
    child = subprocess.Popen([sys.executable, "-m", "tests.support.replay", url, token],
                             cwd=str(ROOT), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             preexec_fn=_low_priority)
    try:
        yield summary
    finally:
        out, _ = child.communicate(timeout=60)
    summary.update(json.loads(out))


def _low_priority() -> None:
    die_with_parent()
    os.nice(19)


def replay_on(url: str, token: str, stop: threading.Event,
              answered: Callable[[httpx.Response], None],
              connections: int = CONNECTIONS) -> list[threading.Thread]:
    """Threads that replay BODIES on `connections` connections, each request as soon as the
    last is answered, until `stop` is set; every answer goes to `answered`."""
    def send() -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                for body in BODIES:
                    answered(client.post(url, json=body,
                                         headers={"Authorization": f"Bearer {token}"}))

    threads = [threading.Thread(target=send, daemon=True) for _ in range(connections)]
    for thread in threads:
        thread.start()
    return threads


def main(url: str, token: str) -> None:
    stop = threading.Event()
    codes: set[tuple[int, str]] = set()
    leaks: list[str] = []
    sent = [0]
    lock = threading.Lock()

    def answered(answer: httpx.Response) -> None:
        with lock:
            sent[0] += 1
            codes.add((answer.status_code, answer.json().get("code")))
            if "succeeded" in answer.text or "output" in answer.text:
                leaks.append(answer.text[:300])

    threads = replay_on(url, token, stop, answered)
    sys.stdin.read()  # until the test closes it
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    print(json.dumps({"sent": sent[0], "codes": sorted(codes), "leaks": leaks[:5]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
