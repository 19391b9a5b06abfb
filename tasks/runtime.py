"""Process-wide handles: the sandbox provider and the worker's identity."""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from pathlib import Path

from tasks.sandbox import SandboxProvider, get_provider
from tasks.settings import get_settings


@lru_cache(maxsize=8)
def _provider(name: str, root: str, pid: int) -> SandboxProvider:
    return get_provider(name, Path(root))


def provider(name: str | None = None) -> SandboxProvider:
    settings = get_settings()
    return _provider(name or settings.sandbox_provider, str(settings.sandbox_root), os.getpid())


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
