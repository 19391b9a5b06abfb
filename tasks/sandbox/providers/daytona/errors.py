"""Every exception the Daytona SDK (or its transports) raises, as one of playrun's kinds.

Daytona says "no capacity" with a 400 and a sentence, so capacity is told from the text;
a 429 carries the create throttler's own Retry-After, preferred over the general one.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import httpx
from daytona import (
    DaytonaAuthenticationError,
    DaytonaBadRequestError,
    DaytonaConflictError,
    DaytonaError,
    DaytonaForbiddenError,
    DaytonaNotFoundError,
    DaytonaQueueTimeoutError,
    DaytonaRateLimitError,
    DaytonaTimeoutError,
)
from daytona.common.errors import (
    DaytonaBadGatewayError,
    DaytonaConnectionError,
    DaytonaServiceUnavailableError,
    DaytonaSpotEvictedError,
)

from tasks.sandbox.base import (
    CapacityUnavailableError,
    ProviderAuthError,
    ProviderError,
    RateLimitedError,
    SandboxNotFoundError,
    TransportError,
)

# The API's quota and scheduling refusals (all HTTP 400): the org's compute pool is full
# or no runner can take the sandbox now. Other 400s are our request's fault.
_CAPACITY = re.compile(
    r"total (cpu|memory|disk|gpu) limit exceeded|no available runners|quota exceeded",
    re.IGNORECASE,
)
# Throttler-specific hints first: a create is limited by the `sandbox-create` throttler.
_RETRY_HEADERS = ("retry-after-sandbox-create", "retry-after")
_RESET_HEADER = "x-ratelimit-reset-sandbox-create"
MAX_RETRY_AFTER_S = 3600.0
MAX_MESSAGE = 300


def retry_after(headers: Mapping[str, Any] | None) -> float | None:
    """The server's wait hint in seconds (delta or HTTP date), bounded; None if absent."""
    if not headers:
        return None
    lowered = {str(k).lower(): v for k, v in headers.items()}
    for name in (*_RETRY_HEADERS, _RESET_HEADER):
        value = lowered.get(name)
        if value is None:
            continue
        seconds = _seconds(str(value).strip())
        if seconds is not None:
            return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)
    return None


def _seconds(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return when.timestamp() - time.time()
    return seconds if math.isfinite(seconds) else None


def _message(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return str(text)[:MAX_MESSAGE]


def is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, DaytonaConflictError)


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, DaytonaNotFoundError)


def answer_lost(exc: BaseException) -> bool:
    """The request may have reached the API but its answer did not reach us."""
    if isinstance(exc, DaytonaQueueTimeoutError):
        return False  # the API said so itself: it destroyed the sandbox
    return isinstance(exc, (DaytonaTimeoutError, DaytonaConnectionError))


def translate(exc: BaseException) -> ProviderError:
    """The ProviderError for any exception out of the SDK; never raises."""
    if isinstance(exc, ProviderError):
        return exc
    message = _message(exc)
    headers = getattr(exc, "headers", None) if isinstance(exc, DaytonaError) else None
    hint = retry_after(headers)
    if isinstance(exc, DaytonaRateLimitError):
        return RateLimitedError(message, retry_after_s=hint)
    if isinstance(exc, (DaytonaQueueTimeoutError, DaytonaSpotEvictedError)):
        return CapacityUnavailableError(message, retry_after_s=hint)
    if isinstance(exc, DaytonaBadRequestError) and _CAPACITY.search(message):
        return CapacityUnavailableError(message, retry_after_s=hint)
    if isinstance(exc, (DaytonaAuthenticationError, DaytonaForbiddenError)):
        return ProviderAuthError(message)
    if isinstance(exc, DaytonaNotFoundError):
        return SandboxNotFoundError(message)
    if isinstance(
        exc,
        (
            DaytonaTimeoutError,
            DaytonaConnectionError,
            DaytonaBadGatewayError,
            DaytonaServiceUnavailableError,
            OSError,
        ),
    ):
        return TransportError(message, retry_after_s=hint)
    if isinstance(exc, httpx.HTTPStatusError):
        return _by_status(exc.response.status_code, message, retry_after(exc.response.headers))
    if isinstance(exc, httpx.TransportError):
        return TransportError(message)
    return ProviderError(message, retry_after_s=hint)


def _by_status(status: int, message: str, hint: float | None) -> ProviderError:
    """For the file transfers the SDK leaves as raw httpx errors."""
    if status == 429:
        return RateLimitedError(message, retry_after_s=hint)
    if status in (401, 403):
        return ProviderAuthError(message)
    if status == 404:
        return SandboxNotFoundError(message)
    if status in (502, 503, 504):
        return TransportError(message, retry_after_s=hint)
    return ProviderError(message, retry_after_s=hint)
