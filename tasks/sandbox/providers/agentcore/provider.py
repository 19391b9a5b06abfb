"""Sandboxes on AWS Bedrock AgentCore Code Interpreter sessions, through boto3.

A sandbox is a session of one code interpreter. Its files go in with the `writeFiles`
tool; the runner is started, detached, by the boot script in a short `executeCommand`
(which returns as soon as the start is on record); status and bounded file reads are
short `executeCommand` calls too.
The session's `sessionTimeoutSeconds` is the hard lifetime; its name carries the labels
(naming.py) and its create token the attempt's key.
"""

from __future__ import annotations

import base64
import builtins
import json
import logging
import math
import re
import shlex
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from tasks.sandbox.base import (
    ExitReport,
    FileRead,
    ProcessStatus,
    ProviderError,
    SandboxNotFoundError,
    SandboxRef,
    SandboxSpec,
)
from tasks.sandbox.providers import bootstrap
from tasks.sandbox.providers.agentcore import naming
from tasks.sandbox.providers.agentcore.client import AgentCoreSettings, Clients, text_of
from tasks.sandbox.providers.agentcore.errors import is_conflict

if TYPE_CHECKING:
    from tasks.settings import Settings

log = logging.getLogger("playrun.sandbox.agentcore")

LABELS_FILE = f"{bootstrap.STATE_DIR}/labels.json"
MAX_LABELS_BYTES = 64 << 10
MAX_LIFETIME_S = 28800  # sessionTimeoutSeconds' ceiling (8 h)
PAGE = 100  # ListCodeInterpreterSessions' maxResults ceiling
_SESSION_ID = re.compile(r"[0-9a-zA-Z]{1,40}")


class AgentCoreProvider:
    name = "agentcore"
    # AWS publishes no start-session rate quota for Code Interpreter (Service Quotas lists
    # none as of boto3 1.44): the start rate learns from the 429s alone.
    create_rate_per_min: float | None = None
    reports_exit = True  # the boot script reports the runner's exit (playrun_boot.py)

    def __init__(self, root: Path, *, settings: Settings | None = None) -> None:
        self.root = Path(root)
        self.config = AgentCoreSettings()
        self.workdir = self.config.workdir.rstrip("/")
        self.clients = Clients(self.config)

    # --- create ------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxRef:
        # No per-session egress control: the interpreter's network mode (SANDBOX, PUBLIC
        # or VPC with security groups) is where spec.egress_hosts is enforced.
        token = naming.client_token(spec.key)
        name = naming.session_name(token, spec.labels)
        request: dict[str, Any] = {
            "codeInterpreterIdentifier": self.config.interpreter_id,
            "name": name,
            "clientToken": token,
        }
        if spec.lifetime_s is not None:
            request["sessionTimeoutSeconds"] = min(
                max(math.ceil(spec.lifetime_s), 1), MAX_LIFETIME_S
            )
        try:
            answer = self.clients.control(
                "start a session", lambda c: c.start_code_interpreter_session(**request)
            )
        except ProviderError as exc:
            if not _collided(exc):
                raise
            # Our own earlier create with this key and other labels (a new lease): adopt it.
            ref = self._find_by_token(token)
            if ref is None:
                raise ProviderError(
                    f"the create token of key {spec.key!r} belongs to a session that is not live"
                ) from exc
            session_id, created_at = ref.sandbox_id, ref.created_at
        else:
            session_id = _session_id(answer.get("sessionId"))
            created_at = _timestamp(answer.get("createdAt"))
        files = {**bootstrap.files_for(spec), LABELS_FILE: json.dumps(dict(spec.labels)).encode()}
        self._write(session_id, files, "upload the sandbox's files")
        return SandboxRef(self.name, session_id, dict(spec.labels), created_at)

    def _find_by_token(self, token: str) -> SandboxRef | None:
        wanted = naming.key_hash(token)
        for item in self._sessions():
            parsed = naming.parse_name(str(item.get("name") or ""))
            if parsed is not None and parsed.key_hash == wanted:
                return SandboxRef(
                    self.name,
                    _session_id(item.get("sessionId")),
                    {},
                    _timestamp(item.get("createdAt")),
                )
        return None

    def _write(self, session_id: str, files: Mapping[str, bytes], what: str) -> None:
        content: builtins.list[dict[str, str | bytes]] = []
        for rel, data in files.items():
            path = f"{self.workdir}/{_relative(rel)}"
            try:
                content.append({"path": path, "text": data.decode()})
            except UnicodeDecodeError:
                content.append({"path": path, "blob": data})
        if not content:
            return
        result = self.clients.tool(session_id, "writeFiles", {"content": content}, what)
        if result["isError"]:
            raise ProviderError(f"{what} in {session_id}: {text_of(result)}")

    # --- the runner --------------------------------------------------------------------

    def exec_detached(
        self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float,
        report: ExitReport | None = None,
    ) -> None:
        if not argv or timeout_s <= 0:
            raise ProviderError("exec_detached needs an argv and a positive timeout")
        sandbox_id = _checked(sandbox_id)
        # A tool call cannot pass env: it goes in a file the boot script reads, then deletes.
        self._write(
            sandbox_id,
            {bootstrap.ENV_FILE: bootstrap.env_json(env, report)},
            "hand the runner its environment",
        )
        command = bootstrap.start_command(
            self.workdir, argv, timeout_s=timeout_s, env_file=bootstrap.ENV_FILE
        )
        # The boot script returns once the start is on record and the runner has let go of
        # the call's output, so a plain command answers at once, with the start's verdict.
        self._command(sandbox_id, command, "start the runner")

    def _command(self, sandbox_id: str, command: str, what: str) -> str:
        """A short command's stdout; a non-zero exit is an error."""
        result = self.clients.tool(
            _checked(sandbox_id), "executeCommand", {"command": command}, what
        )
        out = result["structuredContent"]
        code = out.get("exitCode")
        if not isinstance(code, int) or isinstance(code, bool) or code != 0:
            detail = str(out.get("stderr") or text_of(result))[:300]
            raise ProviderError(f"{what} in {sandbox_id}: exit {code!r}: {detail}")
        stdout = out.get("stdout")
        return stdout if isinstance(stdout, str) else text_of(result, limit=1 << 20)

    def poll(self, sandbox_id: str) -> ProcessStatus:
        stdout = self._command(
            sandbox_id, bootstrap.status_command(self.workdir), "read the runner's status"
        )
        return bootstrap.parse_status(stdout)

    def read_file(
        self, sandbox_id: str, path: str, *, offset: int = 0, max_bytes: int
    ) -> FileRead | None:
        if offset < 0 or max_bytes < 0:
            raise ProviderError("offset and max_bytes must not be negative")
        target = shlex.quote(f"{self.workdir}/{_relative(path)}")
        # Size, then the slice as base64: a tool's output is text, files may not be.
        command = (
            f"if [ ! -f {target} ]; then echo absent; exit 0; fi; "
            f"wc -c < {target}; tail -c +{offset + 1} {target} | head -c {max_bytes}"
            " | base64"
        )
        stdout = self._command(sandbox_id, command, f"read {path}")
        return _file_read(stdout, offset, max_bytes, path)

    # --- delete and list ---------------------------------------------------------------

    def delete(self, sandbox_id: str) -> None:
        try:
            self.clients.control(
                "stop the session",
                lambda c: c.stop_code_interpreter_session(
                    codeInterpreterIdentifier=self.config.interpreter_id,
                    sessionId=_checked(sandbox_id),
                ),
            )
        except SandboxNotFoundError:
            return  # stopped already, expired, or never made

    def list(self, labels: Mapping[str, str]) -> builtins.list[SandboxRef]:
        found = []
        for item in self._sessions():
            parsed = naming.parse_name(str(item.get("name") or ""))
            if parsed is None:
                continue  # not a playrun sandbox
            if False in [parsed.matches(k, v) for k, v in labels.items()]:
                continue
            session_id, created_at = item.get("sessionId"), item.get("createdAt")
            if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
                log.warning("skipping a listed session with an unusable id: %.80r", session_id)
                continue
            full = parsed.labels(labels)
            if full is None:
                # Unread labels would let GC judge another fleet's sandbox: leave it be.
                full = self._labels(session_id)
                if full is None or any(full.get(k) != v for k, v in labels.items()):
                    continue
            # No usable time reads as young: GC's grace keeps it rather than guess its age.
            when = created_at.timestamp() if isinstance(created_at, datetime) else time.time()
            found.append(SandboxRef(self.name, session_id, full, when))
        return found

    def _sessions(self) -> Iterator[dict[str, Any]]:
        """Every live session of the interpreter, page by page."""
        token: str | None = None
        while True:
            request: dict[str, Any] = {
                "codeInterpreterIdentifier": self.config.interpreter_id,
                "status": "READY",
                "maxResults": PAGE,
            }
            if token:
                request["nextToken"] = token
            page: dict[str, Any] = self.clients.control("list sessions", _lister(request))
            items = page.get("items")
            for item in items if isinstance(items, builtins.list) else ():
                if isinstance(item, dict):
                    yield item
            token = page.get("nextToken")
            if not isinstance(token, str) or not token:
                return

    def _labels(self, session_id: str) -> dict[str, str] | None:
        """The labels uploaded at create, for a name too short to hold them all."""
        try:
            found = self.read_file(session_id, LABELS_FILE, max_bytes=MAX_LABELS_BYTES)
        except SandboxNotFoundError:
            return None  # it ended between the list and this read
        if found is None or found.truncated:
            return None
        try:
            doc = json.loads(found.data)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        return {str(k): str(v) for k, v in doc.items()}


def _lister(request: dict[str, Any]) -> Callable[[Any], dict[str, Any]]:
    return lambda client: client.list_code_interpreter_sessions(**request)


def _collided(exc: ProviderError) -> bool:
    """The create token was used before with other parameters (or the service says so)."""
    from botocore.exceptions import ClientError

    cause = exc.__cause__
    return isinstance(cause, ClientError) and is_conflict(cause)


def _relative(path: str) -> str:
    parts = PurePosixPath(path).parts
    if not parts or path.startswith("/") or ".." in parts:
        raise ProviderError(f"sandbox paths are relative to its workdir: {path!r}")
    return "/".join(parts)


def _checked(sandbox_id: str) -> str:
    if not _SESSION_ID.fullmatch(sandbox_id):
        raise SandboxNotFoundError(f"no session {sandbox_id!r}: not a session id")
    return sandbox_id


def _session_id(value: object) -> str:
    if not isinstance(value, str) or not _SESSION_ID.fullmatch(value):
        raise ProviderError(f"the service answered an unusable session id: {value!r:.80}")
    return value


def _timestamp(value: object) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    raise ProviderError(f"the service answered an unusable time: {value!r:.80}")


def _file_read(stdout: str, offset: int, max_bytes: int, path: str) -> FileRead | None:
    """The read command's answer, untrusted: a size line, then base64 of the slice."""
    head, _, rest = stdout.strip().partition("\n")
    if head.strip() == "absent":
        return None
    try:
        size = int(head.strip())
        data = base64.b64decode("".join(rest.split()), validate=True)
    except ValueError as exc:
        raise ProviderError(f"read {path}: not a file read: {stdout[:120]!r}") from exc
    if size < 0 or len(data) > max_bytes:
        raise ProviderError(f"read {path}: {len(data)} bytes answered, {max_bytes} asked")
    return FileRead(data=data, size=size, truncated=offset + len(data) < size)
