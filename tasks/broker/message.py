"""A task message as the relay and the lean publish pass it around."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tasks.constants import PROVIDER_QUEUE_PREFIX, QUEUE

Message = tuple[str, str, list[Any]]  # (task id = outbox row id, task name, args)


def provider_queue(provider: str) -> str:
    """The queue of starts placed on `provider`."""
    return f"{PROVIDER_QUEUE_PREFIX}{provider}"


def start_queue(args: list[Any]) -> str:
    """Where a start goes: its provider's queue when placed ([run_id, provider]), else
    the queue every worker takes."""
    if len(args) > 1 and isinstance(args[1], str) and args[1]:
        return provider_queue(args[1])
    return QUEUE


def start_queues(served: Sequence[str]) -> tuple[str, ...]:
    """The queues the starts of a fleet serving `served` wait on."""
    return (QUEUE, *(provider_queue(name) for name in served))
