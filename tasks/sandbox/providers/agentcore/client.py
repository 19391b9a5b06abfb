"""The boto3 `bedrock-agentcore` client, per process, and the code interpreter's tools.

boto3 reads its own configuration (AWS_* variables, profiles, roles, and
AWS_ENDPOINT_URL_BEDROCK_AGENTCORE); playrun only says which interpreter and how long to
wait. Retries are off: a throttle must reach the start-rate limiter, and a tool call
(InvokeCodeInterpreter) is not idempotent.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from tasks.sandbox.base import ProviderError, TransportError
from tasks.sandbox.providers.agentcore.errors import translate

T = TypeVar("T")
SERVICE = "bedrock-agentcore"
# A tool's answer is a few status lines or one bounded file read; more is not ours.
MAX_RESULT_CHARS = 64 << 20


class AgentCoreSettings(BaseSettings):
    """PLAYRUN_AGENTCORE_*: the interpreter sessions are made from, and the waits."""

    model_config = SettingsConfigDict(env_prefix="PLAYRUN_AGENTCORE_", extra="ignore")

    # The AWS-managed interpreter reaches only S3 and DNS: a gateway callback needs a
    # custom interpreter in PUBLIC or VPC network mode (docs/providers/agentcore.md).
    interpreter_id: str = Field(
        default="aws.codeinterpreter.v1", min_length=1, max_length=256,
        description="The code interpreter sessions are started from; a gateway callback "
                    "needs a custom interpreter in PUBLIC or VPC network mode.")
    # Session start/stop/list; a create that outlives it is found again by its token.
    create_timeout_s: float = Field(
        default=30.0, gt=0, le=600,
        description="Read timeout of session start, stop and list calls.")
    # One tool call: an upload, a status line, a bounded file read.
    call_timeout_s: float = Field(
        default=120.0, gt=0, le=900,
        description="Read timeout of one tool call (an upload, a status line, a file read).")
    connect_timeout_s: float = Field(
        default=10.0, gt=0, le=120, description="Connect timeout of every call.")
    # Relative to the session's working directory, where the file tools write.
    workdir: str = Field(
        default="playrun", min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$",
        description="The runtime's directory, relative to the session's working directory.",
    )


class Clients:
    """Two clients (control calls, tool calls) made lazily, once per process."""

    def __init__(self, settings: AgentCoreSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._pid = -1
        self._made: tuple[Any, Any] | None = None

    def _make(self) -> tuple[Any, Any]:
        import boto3
        from botocore.config import Config

        session = boto3.session.Session()

        def client(read_timeout: float) -> Any:
            config = Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=self.settings.connect_timeout_s,
                read_timeout=read_timeout,
                user_agent_extra="playrun",
            )
            return session.client(SERVICE, config=config)

        return client(self.settings.create_timeout_s), client(self.settings.call_timeout_s)

    def _get(self) -> tuple[Any, Any]:
        with self._lock:
            if self._made is None or self._pid != os.getpid():  # never across a fork
                self._made = self._make()
                self._pid = os.getpid()
            return self._made

    def control(self, what: str, call: Callable[[Any], T]) -> T:
        """One control-plane call; every failure comes back as a taxonomy error."""
        try:
            return call(self._get()[0])
        except Exception as exc:
            raise translate(exc, what) from exc

    def tool(
        self, session_id: str, name: str, arguments: dict[str, Any], what: str
    ) -> dict[str, Any]:
        """One InvokeCodeInterpreter call, its event stream read to its end."""
        try:
            answer = self._get()[1].invoke_code_interpreter(
                codeInterpreterIdentifier=self.settings.interpreter_id,
                sessionId=session_id,
                name=name,
                arguments=arguments,
            )
            return merge_results(answer["stream"], what)
        except Exception as exc:
            raise translate(exc, what) from exc


def merge_results(stream: Any, what: str) -> dict[str, Any]:
    """The stream's result events as one result (output split over events is joined)."""
    content: list[Any] = []
    structured: dict[str, Any] = {}
    is_error, seen, size = False, False, 0
    try:
        for event in stream:
            result = event.get("result") if isinstance(event, dict) else None
            if not isinstance(result, dict):
                continue  # an event type this version does not know
            seen = True
            blocks = result.get("content")
            if isinstance(blocks, list):
                content.extend(blocks)
            part = result.get("structuredContent")
            if isinstance(part, dict):
                for key, value in part.items():
                    if key in ("stdout", "stderr") and isinstance(value, str):
                        size += len(value)
                        structured[key] = structured.get(key, "") + value
                    else:
                        structured[key] = value
            is_error = is_error or result.get("isError") is True
            if size > MAX_RESULT_CHARS:
                raise ProviderError(f"{what}: the tool's answer exceeds {MAX_RESULT_CHARS}")
    finally:
        close = getattr(stream, "close", None)
        if callable(close):
            close()
    if not seen:
        raise TransportError(f"{what}: the tool's answer ended without a result")
    return {"content": content, "structuredContent": structured, "isError": is_error}


def text_of(result: dict[str, Any], limit: int = 300) -> str:
    """The result's text blocks, cut for an error message."""
    texts = [b.get("text") for b in result.get("content") or [] if isinstance(b, dict)]
    return " ".join(t for t in texts if isinstance(t, str))[:limit]
