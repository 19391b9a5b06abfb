"""The provider-neutral sandbox interface and its error taxonomy (docs/providers/)."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from tasks.errors import PlayrunError

ErrorKind = Literal[
    "capacity_unavailable", "rate_limited", "transport", "not_found", "auth", "other"
]
ERROR_KINDS: tuple[ErrorKind, ...] = (
    "capacity_unavailable",
    "rate_limited",
    "transport",
    "not_found",
    "auth",
    "other",
)


class ProviderError(PlayrunError):
    """The sandbox provider failed."""

    code = "PROVIDER_ERROR"
    kind: ErrorKind = "other"

    def __init__(self, message: str = "", *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        # The server's own hint (Retry-After and the like): the start waits at least this.
        self.retry_after_s = retry_after_s


class CapacityUnavailableError(ProviderError):
    """The provider has no capacity for another sandbox right now."""

    code = "PROVIDER_CAPACITY_UNAVAILABLE"
    kind: ErrorKind = "capacity_unavailable"


class RateLimitedError(ProviderError):
    """The provider rate-limited the request."""

    code = "PROVIDER_RATE_LIMITED"
    kind: ErrorKind = "rate_limited"


class TransportError(ProviderError):
    """The provider could not be reached or its answer was lost."""

    code = "PROVIDER_TRANSPORT"
    kind: ErrorKind = "transport"


class SandboxNotFoundError(ProviderError):
    """The sandbox does not exist."""

    code = "SANDBOX_NOT_FOUND"
    kind: ErrorKind = "not_found"


class ProviderAuthError(ProviderError):
    """The provider refused our credentials."""

    code = "PROVIDER_AUTH"
    kind: ErrorKind = "auth"


_BY_KIND: dict[str, type[ProviderError]] = {
    cls.kind: cls
    for cls in (
        ProviderError,
        CapacityUnavailableError,
        RateLimitedError,
        TransportError,
        SandboxNotFoundError,
        ProviderAuthError,
    )
}


def error_for_kind(kind: str, message: str = "", *,
                   retry_after_s: float | None = None) -> ProviderError:
    """The ProviderError subclass instance for a kind name (unknown kinds map to 'other')."""
    return _BY_KIND.get(kind, ProviderError)(message, retry_after_s=retry_after_s)


@dataclass(frozen=True)
class SandboxSpec:
    labels: Mapping[str, str]
    files: Mapping[str, bytes] = field(default_factory=dict)
    memory_mb: int = 1024  # RLIMIT_AS
    max_file_mb: int = 64  # RLIMIT_FSIZE
    cpu_seconds: int | None = None  # RLIMIT_CPU; None: derived from the wall-clock timeout
    max_processes: int | None = None  # RLIMIT_NPROC in strict mode; None: the setting
    max_dir_mb: int | None = None  # disk cap of the sandbox directory; None: the setting
    # Unique per attempt: a create retried with the same key gives the same sandbox.
    key: str = ""
    # Provider-side hard lifetime, the last defence against a fleet that went dark.
    lifetime_s: float | None = None
    # Hosts the sandbox may reach (the gateway's); None: no limit asked.
    egress_hosts: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SandboxRef:
    provider: str
    sandbox_id: str
    labels: Mapping[str, str]
    created_at: float  # unix seconds
    # When this process asked for it (time.monotonic()): the launch record writes the
    # `sandbox.requested` event then, dated back to it (tasks/acquisition/sandbox.py).
    requested_at: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ProcessStatus:
    # missing: the process is gone without an exit record (killed, lost).
    # never_started: nothing of the command ever ran (exec never reached it, or its
    # supervisor never got the command).
    state: Literal["running", "exited", "missing", "never_started"]
    exit_code: int | None = None
    timed_out: bool = False
    # A provider limit that stopped it ("disk": its directory outgrew its cap), if any.
    limit: str | None = None


@dataclass(frozen=True)
class FileRead:
    data: bytes
    size: int  # full size of the file
    truncated: bool  # data was cut at max_bytes


@dataclass(frozen=True)
class ExitReport:
    """How a sandbox's supervisor (a cloud sandbox's boot script) reports its runner's exit
    to the gateway: a token that may do only that (never put in the runner's environment),
    and where the gateway is."""

    token: str
    url: str
    socket: str  # the gateway's Unix socket on this host ("" if none)


@runtime_checkable
class SandboxProvider(Protocol):
    name: str

    def create(self, spec: SandboxSpec) -> SandboxRef: ...

    def exec_detached(
        self,
        sandbox_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        timeout_s: float,
    ) -> None: ...

    def poll(self, sandbox_id: str) -> ProcessStatus: ...

    def read_file(
        self, sandbox_id: str, path: str, *, offset: int = 0, max_bytes: int
    ) -> FileRead | None: ...

    def delete(self, sandbox_id: str) -> None: ...

    def list(self, labels: Mapping[str, str]) -> builtins.list[SandboxRef]: ...


@runtime_checkable
class ExitReporting(Protocol):
    """A provider whose sandboxes report the runner's exit at once (the others are noticed
    by the heartbeat timeout)."""

    reports_exit: bool

    def exec_detached(
        self,
        sandbox_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        timeout_s: float,
        report: ExitReport | None = None,
    ) -> None: ...
