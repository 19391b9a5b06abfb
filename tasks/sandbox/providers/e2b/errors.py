"""E2B's answers and exceptions in playrun's taxonomy.

E2B answers HTTP 429 for two different things: its per-team rate limiter ("Rate limit
exceeded", with Retry-After) and its cap on concurrent sandboxes ("maximum number of
concurrent E2B sandboxes"). The first is pacing, the second is capacity: told apart
by the text. 503 is the service having no room right now.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import httpx
from connectrpc.errors import ConnectError
from e2b import exceptions as ex
from pyqwest import ReadError, StreamError, WriteError

from tasks.sandbox.base import (
    CapacityUnavailableError,
    ProviderAuthError,
    ProviderError,
    RateLimitedError,
    SandboxNotFoundError,
    TransportError,
)

# Bounds on what we keep of a server's text and hint: they come from the network.
MAX_MESSAGE_CHARS = 300
MAX_RETRY_AFTER_S = 3600.0
CONCURRENCY_TEXT = "concurrent"
IDEMPOTENCY_MISMATCH = "idempotency_request_mismatch"
IDEMPOTENCY_IN_PROGRESS = "idempotency_in_progress"


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Retry-After in delta-seconds (the form E2B sends), bounded; None if absent or odd."""
    raw = (headers.get("retry-after") or headers.get("Retry-After") or "").strip()
    if not raw or len(raw) > 12:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    if value != value or value < 0:  # NaN or negative
        return None
    return min(value, MAX_RETRY_AFTER_S)


def body_fields(content: bytes) -> tuple[str, str]:
    """(message, error_code) of an E2B error body; a body that is not E2B's JSON is text."""
    text = content[:4096].decode("utf-8", "replace")
    try:
        doc = json.loads(content) if len(content) <= 65536 else None
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        message = doc.get("message")
        code = doc.get("error_code")
        return (
            str(message)[:MAX_MESSAGE_CHARS] if message is not None else "",
            str(code)[:80] if isinstance(code, str) else "",
        )
    return text[:MAX_MESSAGE_CHARS], ""


def from_status(
    status: int, message: str, *, error_code: str = "", retry_after_s: float | None = None
) -> ProviderError:
    """The error for an E2B API answer that is not a success."""
    text = f"e2b answered {status}: {message}" if message else f"e2b answered {status}"
    if status == 429:
        if CONCURRENCY_TEXT in message.lower():
            return CapacityUnavailableError(text, retry_after_s=retry_after_s)
        return RateLimitedError(text, retry_after_s=retry_after_s)
    if status == 503:
        return CapacityUnavailableError(text, retry_after_s=retry_after_s)
    if status in (401, 403):
        return ProviderAuthError(text)
    if status == 404:
        return SandboxNotFoundError(text)
    if status == 409 and error_code == IDEMPOTENCY_IN_PROGRESS:
        # The first create under this key is still being made: ask again soon.
        return TransportError(text, retry_after_s=retry_after_s or 1.0)
    if status in (408, 502, 504):
        return TransportError(text, retry_after_s=retry_after_s)
    return ProviderError(text, retry_after_s=retry_after_s)


def mapped(exc: BaseException) -> ProviderError:
    """Any exception the SDK or its transport raised, in the taxonomy."""
    if isinstance(exc, ProviderError):
        return exc
    text = f"{type(exc).__name__}: {str(exc)[:MAX_MESSAGE_CHARS]}"
    if isinstance(exc, ex.RateLimitException):
        if CONCURRENCY_TEXT in text.lower():
            return CapacityUnavailableError(text)
        return RateLimitedError(text)
    if isinstance(exc, ex.ServiceBusyException):
        return CapacityUnavailableError(text)
    if isinstance(exc, ex.AuthenticationException):
        return ProviderAuthError(text)
    if isinstance(exc, (ex.SandboxNotFoundException, ex.SandboxNotRunningException)):
        return SandboxNotFoundError(text)
    if isinstance(exc, (ex.SandboxUnreachableException, ex.TimeoutException)):
        return TransportError(text)
    if isinstance(exc, ex.NotFoundException):
        # A not-found from the control plane is the sandbox; a file's is handled by callers.
        return SandboxNotFoundError(text)
    if isinstance(exc, ex.SandboxException) and exc.status_code is not None:
        return from_status(exc.status_code, str(exc)[:MAX_MESSAGE_CHARS])
    # pyqwest and httpx failures reach us raw: a lost answer, a refused connection.
    if isinstance(
        exc, (httpx.TransportError, OSError, ReadError, WriteError, StreamError, ConnectError)
    ):
        return TransportError(text)
    return ProviderError(text)
