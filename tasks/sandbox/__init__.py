"""Sandbox providers behind one provider-neutral interface (SPEC 4.5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.errors import ConfigurationError
from tasks.sandbox.base import (
    ERROR_KINDS,
    CapacityUnavailableError,
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
    try:
        cls = PROVIDERS[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown sandbox provider {name!r}; known: {sorted(PROVIDERS)}"
        ) from None
    return cls(Path(root), **opts)
