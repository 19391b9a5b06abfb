"""A warm sandbox's runner before it has a run: `python runner.py --standby --timeout LIFE`.

Standard library only; copied into each sandbox as playrun_standby.py beside runner.py. It
asks the gateway for its assignment with a token that can do nothing else, the gateway
holding each call until one is ready. The assignment brings the run's play, input and own
tokens: they are written beside runner.py and put in the environment, and from there this
process is that run's runner. Its own way to the gateway (a strict sandbox's socket path)
stays as the sandbox was given it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the host imports the runner's files as tasks.execution.*
    from tasks import protocol
    from tasks.execution.runner_client import Gateway, Refused, Unavailable
else:  # in the sandbox they are flat files beside runner.py
    import playrun_protocol as protocol
    from playrun_client import Gateway, Refused, Unavailable

# Each call asks the gateway to hold it this long (under the client's socket timeout).
WAIT_S = 8.0
PAUSE_FIRST_S = 0.1
PAUSE_MAX_S = 5.0
# The sandbox's own way to the gateway wins over what the assignment says.
_OWN = ("PLAYRUN_GATEWAY_URL", "PLAYRUN_GATEWAY_SOCKET")


def await_assignment(life_s: float) -> dict[str, Any] | None:
    """The run this sandbox is to serve, or None: retired, refused, or its life is over."""
    token = os.environ.pop("PLAYRUN_STANDBY_TOKEN", "")
    url = os.environ.get("PLAYRUN_GATEWAY_URL", "")
    if not token or not url:
        return None
    gateway = Gateway(url, os.environ.get("PLAYRUN_GATEWAY_SOCKET") or None)
    deadline = time.monotonic() + life_s
    pause = PAUSE_FIRST_S
    while time.monotonic() < deadline:
        try:
            got = gateway.call(token, {"action": protocol.ACTION_STANDBY, "wait_s": WAIT_S})
        except Refused:
            return None  # its token expired or was refused: nothing will come
        except Unavailable:
            time.sleep(pause)
            pause = min(pause * 2, PAUSE_MAX_S)
            continue
        pause = PAUSE_FIRST_S
        if isinstance(got, dict):
            if got.get("stop"):
                return None
            if got.get("assigned"):
                return got
    return None


def take(assignment: dict[str, Any], directory: Path) -> float:
    """Write the run's play and input, take its environment; the run's time limit."""
    (directory / protocol.PLAY_FILE).write_text(str(assignment.get("play") or ""))
    (directory / protocol.INPUT_FILE).write_text(json.dumps(assignment.get("input")))
    env = assignment.get("env")
    for name, value in (env.items() if isinstance(env, dict) else ()):
        if str(name) not in _OWN:
            os.environ[str(name)] = str(value)
    return float(assignment.get("timeout_s") or 0) or 60.0
