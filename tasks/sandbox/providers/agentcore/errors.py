"""Every boto3/botocore failure, read once into playrun's provider taxonomy.

AgentCore answers pushback as HTTP errors (429 ThrottlingException, 402
ServiceQuotaExceededException) and, for a tool call, possibly as an exception inside an
event stream that began with 200 (botocore's EventStreamError, its code in lowerCamel).
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    CredentialRetrievalError,
    HTTPClientError,
    NoAuthTokenError,
    NoCredentialsError,
    PartialCredentialsError,
    TokenRetrievalError,
)

from tasks.sandbox.base import (
    CapacityUnavailableError,
    ProviderAuthError,
    ProviderError,
    RateLimitedError,
    SandboxNotFoundError,
    TransportError,
)

MAX_RETRY_AFTER_S = 3600.0
MAX_MESSAGE = 300
_RATE = {
    "throttlingexception",
    "throttling",
    "toomanyrequestsexception",
    "requestlimitexceeded",
    "slowdown",
}
_CAPACITY = {"servicequotaexceededexception", "limitexceededexception"}
_NOT_FOUND = {"resourcenotfoundexception"}
_AUTH = {
    "accessdeniedexception",
    "unrecognizedclientexception",
    "invalidsignatureexception",
    "expiredtokenexception",
    "expiredtoken",
    "invalidclienttokenid",
    "incompletesignature",
    "missingauthenticationtokenexception",
    "signaturedoesnotmatch",
}
_CREDENTIALS = (
    NoCredentialsError,
    PartialCredentialsError,
    CredentialRetrievalError,
    NoAuthTokenError,
    TokenRetrievalError,
)


def retry_after(headers: Any) -> float | None:
    """The server's Retry-After (seconds or an HTTP date), bounded; None without one."""
    raw = headers.get("retry-after") if isinstance(headers, dict) else None
    if not isinstance(raw, str) or not raw.strip():
        return None
    try:
        seconds = float(raw)
    except ValueError:
        when = email.utils.parsedate_to_datetime(raw) if raw else None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def error_code(exc: ClientError) -> str:
    error = exc.response.get("Error") or {}
    return str(error.get("Code") or "")


def is_conflict(exc: ClientError) -> bool:
    """The create collided with our own earlier one (same token, other parameters)."""
    code = error_code(exc).lower()
    reason = str(exc.response.get("reason") or "")
    return code == "conflictexception" or (
        code == "validationexception" and reason == "IdempotentParameterMismatchException"
    )


def _client_error(exc: ClientError, what: str) -> ProviderError:
    code = error_code(exc)
    meta = exc.response.get("ResponseMetadata") or {}
    status = meta.get("HTTPStatusCode")
    hint = retry_after(meta.get("HTTPHeaders"))
    message = f"{what}: {code or status}: {str(exc)[:MAX_MESSAGE]}"
    lowered = code.lower()
    if lowered in _RATE or status == 429:
        return RateLimitedError(message, retry_after_s=hint)
    if lowered in _CAPACITY or status == 402:
        return CapacityUnavailableError(message, retry_after_s=hint)
    if lowered in _NOT_FOUND or status == 404:
        return SandboxNotFoundError(message)
    if lowered in _AUTH or status in (401, 403):
        return ProviderAuthError(message)
    if (
        isinstance(status, int)
        and status >= 500
        or lowered in ("internalserverexception", "serviceunavailableexception")
    ):
        return TransportError(message, retry_after_s=hint)
    return ProviderError(message, retry_after_s=hint)


def translate(exc: BaseException, what: str) -> ProviderError:
    """The taxonomy error for anything boto3 raised while doing `what`."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, ClientError):
        return _client_error(exc, what)
    if isinstance(exc, _CREDENTIALS):
        return ProviderAuthError(f"{what}: {type(exc).__name__}")
    if isinstance(exc, (ConnectionError, HTTPClientError)):
        return TransportError(f"{what}: {type(exc).__name__}: {str(exc)[:MAX_MESSAGE]}")
    if isinstance(exc, BotoCoreError):
        return ProviderError(f"{what}: {type(exc).__name__}: {str(exc)[:MAX_MESSAGE]}")
    if isinstance(exc, OSError):
        return TransportError(f"{what}: {type(exc).__name__}: {str(exc)[:MAX_MESSAGE]}")
    return ProviderError(f"{what}: {type(exc).__name__}: {str(exc)[:MAX_MESSAGE]}")
