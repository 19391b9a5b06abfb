"""What the hard-exit scenarios share: the play, the bound, a gateway whose heartbeat
timeout is far above it, and how long a run took to settle."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import tasks
from tasks.host.processes import free_port
from tests.support.env import GATEWAY_DIR
from tests.support.metrics import endpoint, scrape
from tests.support.paths import PLAYS
from tests.support.runs import FAST_STARTS, TERMINAL_EVENTS
from tests.support.stack import Gateway, worker_env

HARD_EXIT = PLAYS / "hard_exit.py"
# Far above the bound: a run settled within it was not settled by the heartbeat timeout.
HEARTBEAT_TIMEOUT_S = 60
BOUND_S = 5.0


def org() -> str:
    return f"hx-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class OwnGateway:
    env: dict[str, str]  # a worker's settings that point it at this gateway
    gateway: Gateway

    def exits_reported(self) -> float:
        """`exited` requests this gateway has answered, whatever it answered."""
        url = endpoint(self.env, "gateway", self.gateway.proc)  # type: ignore[arg-type]
        return sum(value for (name, labels), value in scrape(url).items()
                   if name == "playrun_gateway_requests_total"
                   and dict(labels).get("action") == "exited")


@contextmanager
def own_gateway(heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S) -> Iterator[OwnGateway]:
    """A gateway of its own: the session's has a short heartbeat timeout, and counters
    other tests move."""
    port = free_port()
    env = worker_env(PLAYRUN_GATEWAY_URL=f"http://127.0.0.1:{port}",
                     PLAYRUN_GATEWAY_SOCKET=str(GATEWAY_DIR / f"hx{port}" / "gateway.sock"),
                     PLAYRUN_HEARTBEAT_TIMEOUT_S=f"{heartbeat_timeout_s:g}", **FAST_STARTS)
    gateway = Gateway(env)
    try:
        yield OwnGateway(env, gateway)
    finally:
        gateway.stop()


def terminal_at(run_id: str) -> float:
    """Epoch seconds of the run's terminal event, by the database's clock."""
    return next(e.at for e in tasks.run_events(run_id)
                if e.kind in TERMINAL_EVENTS).timestamp()


def settle_s(run_id: str) -> float:
    """Seconds from the sandbox going live (before the play started) to the terminal."""
    live = next(e.at for e in tasks.run_events(run_id) if e.kind == "sandbox.live")
    return terminal_at(run_id) - live.timestamp()


def exit_to_terminal_s(run_id: str, marker: Path) -> float:
    """Seconds from the play's exit (the time it wrote to `marker` on this host just
    before) to the run's terminal."""
    return terminal_at(run_id) - float(marker.read_text())
