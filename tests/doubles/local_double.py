"""The `local` provider in the conformance suite's shape (it has no server to push back)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tasks.sandbox import LocalProvider
from tasks.sandbox.local.processes import kill_sandbox
from tests.doubles.base import PushBack


class LocalDouble:
    name = "local"
    env: dict[str, str] = {}
    pushback = False

    def __init__(self, root: Path) -> None:
        self.root = root
        self._provider = LocalProvider(root, isolation="process")

    def provider(self, root: Path) -> LocalProvider:
        return self._provider

    def push_back(self, kind: PushBack, *, retry_after_s: float | None = None,
                  times: int = 1) -> None:
        raise NotImplementedError("the local provider has no server to push back")

    def create_after_timeout(self) -> None:
        raise NotImplementedError("the local provider has no answer to lose")

    def kill_runner(self, sandbox_id: str) -> None:
        prov = self._provider
        kill_sandbox(sandbox_id, prov.control_root / sandbox_id, prov.root / sandbox_id)

    def sandboxes(self) -> list[str]:
        return [ref.sandbox_id for ref in self._provider.list({})]

    def live_count(self) -> int:
        return len(self.sandboxes())

    def max_live_seen(self) -> int:
        return self.live_count()

    def creates(self) -> int:
        return self.live_count()

    def rejected_429(self) -> int:
        return 0


@contextmanager
def running(tmp_path: Path, **_knobs: Any) -> Iterator[LocalDouble]:
    yield LocalDouble(tmp_path / "local-sandboxes")
