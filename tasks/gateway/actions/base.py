"""What every gateway action shares: its request model base and its context."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from tasks.gateway.beats import BeatBatcher
from tasks.gateway.refusals import Refusals
from tasks.gateway.releases import ReleaseBatcher, Send
from tasks.gateway.wakeups import Wakeups
from tasks.security.tokens import Grant
from tasks.settings import Settings, get_settings
from tasks.store.fence import LaunchFence


class ActionRequest(BaseModel):
    """Unknown fields are refused, never ignored (docs/contract.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Context:
    settings: Settings
    # Heartbeats are answered together, one transaction per window (beats.py).
    beats: BeatBatcher
    # Releases after a pushed terminal go out together, one task per queue and window (the
    # gateway never deletes a sandbox itself).
    releases: ReleaseBatcher
    # Each attempt's refused requests: rows still to write before its terminal.
    refusals: Refusals
    # Wakes warm sandboxes' standby calls when their assignment is ready.
    wakeups: Wakeups = field(default_factory=lambda: Wakeups(get_settings().redis_url))

    @property
    def send(self) -> Send:
        """The gateway's task sender, the one its releases go out by."""
        return self.releases.send


def launch_of(grant: Grant) -> LaunchFence:
    return LaunchFence(grant.run_id, grant.generation, grant.launch_id)


Handler = Callable[[Grant, Any, Context], dict[str, Any]]
# A handler that only waits (heartbeat) is a coroutine, run on the event loop.
AsyncHandler = Callable[[Grant, Any, Context], Awaitable[dict[str, Any]]]


KIB = 1024


@dataclass(frozen=True)
class Action:
    name: str
    capability: str
    model: type[ActionRequest]
    handler: Handler | AsyncHandler
    # The largest body an honest runner sends for it (the gateway's limit caps it too).
    max_bytes: int = 64 * KIB
