"""Sandbox providers behind one provider-neutral interface (docs/providers/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.sandbox import providers
from tasks.sandbox.base import (
    ERROR_KINDS,
    CapacityUnavailableError,
    ExitReport,
    ExitReporting,
    FileRead,
    ProcessStatus,
    ProviderAuthError,
    ProviderError,
    RateLimitedError,
    SandboxNotFoundError,
    SandboxProvider,
    SandboxRef,
    SandboxSpec,
    TransportError,
    error_for_kind,
)
from tasks.sandbox.fake import FakeProvider, FakeScript
from tasks.sandbox.local import LocalProvider

__all__ = [
    "ERROR_KINDS",
    "CapacityUnavailableError",
    "ExitReport",
    "ExitReporting",
    "FakeProvider",
    "FakeScript",
    "FileRead",
    "LocalProvider",
    "ProcessStatus",
    "ProviderAuthError",
    "ProviderError",
    "RateLimitedError",
    "SandboxNotFoundError",
    "SandboxProvider",
    "SandboxRef",
    "SandboxSpec",
    "TransportError",
    "error_for_kind",
    "get_provider",
]

PROVIDERS: dict[str, type[LocalProvider]] = {"local": LocalProvider, "fake": FakeProvider}


def get_provider(name: str, root: Path, **opts: Any) -> SandboxProvider:
    """A provider by name; `opts` go to its constructor (e.g. pid_namespace=False)."""
    cls = PROVIDERS.get(name)
    if cls is None:
        return providers.load(name, Path(root), opts.get("settings"))
    return cls(Path(root), **opts)
