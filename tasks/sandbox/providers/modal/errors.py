"""Every exception the Modal SDK raises, as one of playrun's provider errors.

Modal answers over gRPC: the SDK turns the status into its own exception type and keeps
the server's details (an RPCRetryPolicy with the pushback hint among them) on it.
"""

from __future__ import annotations

import asyncio
import math

import modal.exception as mx
from grpclib import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from h2.exceptions import ProtocolError as H2ProtocolError
from modal_proto import api_pb2

from tasks.sandbox.base import (
    CapacityUnavailableError,
    ProviderAuthError,
    ProviderError,
    RateLimitedError,
    SandboxNotFoundError,
    TransportError,
)

# Rate limit and capacity are both RESOURCE_EXHAUSTED: only the text tells them apart.
_RATE_WORDS = ("rate limit", "rate-limit", "too many requests", "throttl")
# A server hint longer than this is not a hint we wait on.
MAX_RETRY_AFTER_S = 3600.0
# An untrusted message is cut to this length before it reaches logs and errors.
MAX_MESSAGE = 300

_TRANSPORT: tuple[type[BaseException], ...] = (
    mx.ServiceError,
    mx.ConnectionError,
    mx.TimeoutError,
    mx.ClientClosed,
    mx.InternalError,
    StreamTerminatedError,
    ProtocolError,
    H2ProtocolError,
    asyncio.TimeoutError,
    TimeoutError,
    OSError,
)


def retry_after(exc: BaseException) -> float | None:
    """The server's RPCRetryPolicy.retry_after_secs, if it sent one."""
    details = getattr(exc, "_grpc_details", None)
    if details is None and isinstance(exc, GRPCError) and not isinstance(exc, mx.Error):
        details = exc.details  # raw grpclib (the SDK's own errors warn on .details)
    for detail in details or ():
        if isinstance(detail, api_pb2.RPCRetryPolicy):
            hint = float(detail.retry_after_secs)
            if math.isfinite(hint) and hint >= 0:
                return min(hint, MAX_RETRY_AFTER_S)
    return None


def message_of(exc: BaseException) -> str:
    text = getattr(exc, "_grpc_message", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())[:MAX_MESSAGE]


def is_rate_limit(exc: BaseException) -> bool:
    return isinstance(exc, mx.ResourceExhaustedError) and any(
        word in message_of(exc).lower() for word in _RATE_WORDS
    )


def mapped(exc: BaseException, doing: str) -> ProviderError:
    """The provider error for an SDK exception raised while `doing` something."""
    if isinstance(exc, ProviderError):
        return exc
    text = f"modal {doing}: {type(exc).__name__}: {message_of(exc)}"
    hint = retry_after(exc)
    if isinstance(exc, mx.ResourceExhaustedError):
        if is_rate_limit(exc):
            return RateLimitedError(text, retry_after_s=hint)
        return CapacityUnavailableError(text, retry_after_s=hint)
    if isinstance(exc, (mx.AuthError, mx.PermissionDeniedError)):
        return ProviderAuthError(text, retry_after_s=hint)
    if isinstance(exc, (mx.NotFoundError, mx.SandboxTerminatedError)):
        return SandboxNotFoundError(text)
    if isinstance(exc, _TRANSPORT):
        return TransportError(text, retry_after_s=hint)
    if isinstance(exc, GRPCError) and not isinstance(exc, mx.Error):
        # A status the SDK did not convert (raw grpclib): judge it by its code.
        return _by_status(exc, text, hint)
    return ProviderError(text, retry_after_s=hint)


def _by_status(exc: GRPCError, text: str, hint: float | None) -> ProviderError:
    if exc.status == Status.RESOURCE_EXHAUSTED:
        if any(word in text.lower() for word in _RATE_WORDS):
            return RateLimitedError(text, retry_after_s=hint)
        return CapacityUnavailableError(text, retry_after_s=hint)
    if exc.status in (Status.UNAUTHENTICATED, Status.PERMISSION_DENIED):
        return ProviderAuthError(text)
    if exc.status == Status.NOT_FOUND:
        return SandboxNotFoundError(text)
    if exc.status in (
        Status.UNAVAILABLE,
        Status.DEADLINE_EXCEEDED,
        Status.CANCELLED,
        Status.UNKNOWN,
        Status.INTERNAL,
    ):
        return TransportError(text, retry_after_s=hint)
    return ProviderError(text, retry_after_s=hint)
