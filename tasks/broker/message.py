"""A task message as the relay and the lean publish pass it around."""

from __future__ import annotations

from typing import Any

Message = tuple[str, str, list[Any]]  # (task id = outbox row id, task name, args)
