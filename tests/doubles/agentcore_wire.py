"""AWS rest-json and event-stream framing for the AgentCore double (what botocore parses).

An event-stream message: a 12-byte prelude (total length, headers length, CRC32 of the
two), typed headers, the payload, then a CRC32 of everything before it.
"""

from __future__ import annotations

import binascii
import json
import struct
from datetime import UTC, datetime
from typing import Any

EVENT_STREAM = "application/vnd.amazon.eventstream"
_STRING_HEADER = 7


class ApiError(Exception):
    """An AWS error answer: HTTP status, the error type botocore reads, a message."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> bytes:
        return json.dumps({"message": self.message, **self.extra}).encode()


def throttled(retry_after_s: float | None) -> ApiError:
    headers = {} if retry_after_s is None else {"Retry-After": f"{retry_after_s:g}"}
    return ApiError(429, "ThrottlingException", "Rate exceeded", headers=headers)


def quota_exceeded(limit: int, retry_after_s: float | None = None) -> ApiError:
    headers = {} if retry_after_s is None else {"Retry-After": f"{retry_after_s:g}"}
    return ApiError(
        402,
        "ServiceQuotaExceededException",
        f"The maximum number of active sessions ({limit}) has been reached",
        headers=headers,
    )


def access_denied() -> ApiError:
    return ApiError(
        403,
        "AccessDeniedException",
        "User is not authorized to perform: bedrock-agentcore:StartCodeInterpreterSession",
    )


def not_found(what: str) -> ApiError:
    return ApiError(404, "ResourceNotFoundException", f"{what} not found")


def invalid(message: str, reason: str = "FieldValidationFailed") -> ApiError:
    return ApiError(400, "ValidationException", message, reason=reason)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return (
        struct.pack("!B", len(raw_name))
        + raw_name
        + struct.pack("!BH", _STRING_HEADER, len(raw_value))
        + raw_value
    )


def _message(headers: dict[str, str], payload: bytes) -> bytes:
    head = b"".join(_header(k, v) for k, v in headers.items())
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack("!II", total, len(head))
    prelude += struct.pack("!I", binascii.crc32(prelude))
    body = prelude + head + payload
    return body + struct.pack("!I", binascii.crc32(body))


def result_event(result: dict[str, Any]) -> bytes:
    """One `result` event of InvokeCodeInterpreter's stream."""
    return _message(
        {":event-type": "result", ":content-type": "application/json", ":message-type": "event"},
        json.dumps(result).encode(),
    )


def exception_event(error: ApiError) -> bytes:
    """An error inside the stream, after a 200: botocore raises EventStreamError."""
    member = error.code[0].lower() + error.code[1:]
    return _message(
        {
            ":exception-type": member,
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        error.body(),
    )
