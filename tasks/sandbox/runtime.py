"""Process-wide handles: the sandbox provider and the worker's identity."""

from __future__ import annotations

import hashlib
import os
import re
import socket
from functools import lru_cache
from pathlib import Path

from tasks.constants import HOST_QUEUE_PREFIX
from tasks.sandbox import SandboxProvider, get_provider
from tasks.settings import get_settings


@lru_cache(maxsize=8)
def _provider(name: str, root: str, pid: int) -> SandboxProvider:
    return get_provider(name, Path(root))


def provider(name: str | None = None) -> SandboxProvider:
    settings = get_settings()
    name = name or settings.primary_provider
    # Two providers of one host keep their sandboxes apart: the same key names one each.
    root = settings.sandbox_root if len(settings.served) == 1 else settings.sandbox_root / name
    return _provider(name, str(root), os.getpid())


# Set by a worker's main process at start-up (inherited by its pool children), so the
# attempts a node claims name it and its next life can take back what this one left.
NODE_ENV = "PLAYRUN_WORKER_NODE"


def worker_id() -> str:
    node = os.environ.get(NODE_ENV)
    return f"{node}:{os.getpid()}" if node else f"{socket.gethostname()}:{os.getpid()}"


def host_queue(provider_name: str | None = None) -> str | None:
    """The queue of this host's sandboxes, for providers whose sandboxes live on one host.

    A `local` sandbox exists only on (this machine, this sandbox root): two workers with
    their own roots are two hosts, even on one machine. None: any worker reaches it.
    """
    settings = get_settings()
    name = provider_name or settings.primary_provider
    if name != "local":
        return None
    root = str(Path(settings.sandbox_root).resolve())
    digest = hashlib.sha256(root.encode()).hexdigest()[:10]
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:80]
    return f"{HOST_QUEUE_PREFIX}{host}.{digest}"
