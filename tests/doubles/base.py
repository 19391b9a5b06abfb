"""What every provider double offers the conformance suite and the end-to-end scenarios.

A double is a real loopback server that speaks its provider's wire protocol to the
provider's real SDK, and runs each sandbox's commands as local processes.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Literal, Protocol

from tasks.sandbox import SandboxProvider

PushBack = Literal["rate_limited", "capacity_unavailable", "auth"]


class Double(Protocol):
    name: str
    # The SDK's own variables that point a worker subprocess at this double.
    env: dict[str, str]
    # False for providers that cannot be told to push back (local): those cases skip.
    pushback: bool

    def provider(self, root: Path) -> SandboxProvider: ...

    def push_back(self, kind: PushBack, *, retry_after_s: float | None = None,
                  times: int = 1) -> None: ...

    def create_after_timeout(self) -> None: ...

    def kill_runner(self, sandbox_id: str) -> None: ...

    def live_count(self) -> int: ...

    def max_live_seen(self) -> int: ...

    def creates(self) -> int: ...

    def rejected_429(self) -> int: ...

    def sandboxes(self) -> list[str]: ...


Runner = Callable[..., AbstractContextManager[Double]]


def discover() -> dict[str, Runner]:
    """Every tests/doubles/<name>_double.py module's `running`, by provider name."""
    found: dict[str, Runner] = {}
    package = importlib.import_module("tests.doubles")
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.endswith("_double"):
            module = importlib.import_module(f"tests.doubles.{info.name}")
            found[info.name.removesuffix("_double")] = module.running
    return dict(sorted(found.items()))


def iter_names() -> Iterator[str]:
    yield from discover()
