"""E2B sandboxes on the official `e2b` SDK (control plane REST, envd connect-rpc).

A sandbox is created with the run's labels as metadata, one per attempt through E2B's
Idempotency-Key, with a hard lifetime and, when asked, egress only to the gateway's
host. The runner is started by the shared boot script; its status is read by running
the boot script's status command, and files through envd's file API.
"""

from __future__ import annotations

import builtins
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from e2b import CommandExitException, SandboxQuery, SandboxState
from e2b import exceptions as ex

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
from tasks.sandbox.providers.e2b.client import Created, Session, refused_error
from tasks.sandbox.providers.e2b.errors import IDEMPOTENCY_MISMATCH, mapped

if TYPE_CHECKING:
    from tasks.settings import Settings

# The label that finds an attempt's sandbox again when its create answer is unusable.
LABEL_KEY = "playrun.key"
DEFAULT_TEMPLATE = "base"  # E2B's default image: Debian with python3
REQUEST_TIMEOUT_S = 60.0
STATUS_TIMEOUT_S = 30.0
LIST_PAGE = 100
MAX_LIST_PAGES = 100  # 10,000 sandboxes: far past any account's concurrency cap
# E2B's lifetime bounds: 24 h on Pro (1 h on Hobby, where the API answers an error).
MAX_LIFETIME_S = 86_400
# playrun_boot.py start's exit when a runner was started here already: a repeated exec.
ALREADY_STARTED = 3


class E2BProvider:
    name = "e2b"
    # E2B's published creation limit on the Hobby tier, 1 per second
    # (e2b.dev/docs/sandbox/rate-limits); Pro allows 5/s, set through the bucket.
    create_rate_per_min: float | None = 60.0
    reports_exit = True  # the boot script reports the runner's exit (playrun_boot.py)

    def __init__(
        self,
        root: Path,
        *,
        settings: Settings | None = None,
        api_params: Mapping[str, Any] | None = None,
        template: str = DEFAULT_TEMPLATE,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.root = Path(root)
        self.settings = settings
        self.template = template
        self.workdir = bootstrap.WORKDIR
        # The SDK reads E2B_API_KEY and the endpoints itself; these only override (tests).
        self._params: dict[str, Any] = {
            **(api_params or {}),
            "retries": 0,
            "request_timeout": request_timeout_s,
        }
        self._session: Session | None = None
        self._lock = threading.Lock()

    def _sdk(self) -> Session:
        with self._lock:
            if self._session is None or self._session.pid != os.getpid():
                self._session = Session(self._params)
            return self._session

    # -- create ------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxRef:
        metadata = dict(spec.labels)
        if spec.key:
            metadata[LABEL_KEY] = spec.key
        lifetime = (
            None
            if spec.lifetime_s is None
            else min(MAX_LIFETIME_S, max(1, math.ceil(spec.lifetime_s)))
        )
        sdk = self._sdk()
        try:
            answer = sdk.create(
                template=self.template,
                metadata=metadata,
                timeout_s=lifetime,
                egress=spec.egress_hosts,
                key=spec.key,
            )
        except Exception as exc:
            # A lost answer: the sandbox may exist. The same key finds it on the next create.
            raise mapped(exc) from exc
        if isinstance(answer, Created):
            sandbox_id = answer.sandbox_id
        elif answer.error_code == IDEMPOTENCY_MISMATCH and spec.key:
            # Same attempt, other labels (a new lease): the attempt's sandbox is still its own.
            found = self.list({LABEL_KEY: spec.key})
            if not found:
                raise refused_error(answer)
            sandbox_id = found[0].sandbox_id
        else:
            raise refused_error(answer)
        self._upload(sandbox_id, bootstrap.files_for(spec))
        return SandboxRef(
            provider=self.name, sandbox_id=sandbox_id, labels=metadata, created_at=time.time()
        )

    def _upload(self, sandbox_id: str, files: Mapping[str, bytes]) -> None:
        entries: list[Any] = [
            {"path": f"{self.workdir}/{name}", "data": data} for name, data in files.items()
        ]
        self._call(sandbox_id, lambda sbx: sbx.files.write_files(entries))

    # -- the runner --------------------------------------------------------------------

    def exec_detached(
        self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float,
        report: ExitReport | None = None,
    ) -> None:
        env_file = None
        if report is not None:
            # The command's envs would show in the keeper's /proc/<pid>/environ, which the
            # play can read: the report's token goes in a file the boot script deletes.
            env_file = bootstrap.ENV_FILE
            self._upload(sandbox_id, {env_file: bootstrap.env_json({}, report)})
        command = bootstrap.start_command(self.workdir, argv, timeout_s=timeout_s,
                                          env_file=env_file)
        # timeout=0: E2B's default 60 s deadline on a command kills what it started.
        # The boot script returns within seconds, once the runner's start is on record.
        try:
            self._call(sandbox_id, lambda sbx: sbx.commands.run(command, envs=dict(env), timeout=0))
        except _Exited as done:
            if done.exit_code != ALREADY_STARTED:
                raise ProviderError(
                    f"the boot script could not start the runner (exit {done.exit_code}): "
                    f"{done.stderr}"
                ) from None

    def poll(self, sandbox_id: str) -> ProcessStatus:
        command = bootstrap.status_command(self.workdir)
        try:
            result = self._call(
                sandbox_id, lambda sbx: sbx.commands.run(command, timeout=STATUS_TIMEOUT_S)
            )
        except _Exited as done:
            raise ProviderError(
                f"the status command failed (exit {done.exit_code}): {done.stderr}"
            ) from None
        return bootstrap.parse_status(str(result.stdout or ""))

    def read_file(
        self, sandbox_id: str, path: str, *, offset: int = 0, max_bytes: int
    ) -> FileRead | None:
        full = f"{self.workdir}/{path.lstrip('/')}"

        def read(sbx: Any) -> FileRead | None:
            try:
                size = int(sbx.files.get_info(full).size)
            except ex.FileNotFoundException:
                return None
            except ex.NotFoundException as exc:
                if _sandbox_gone(exc):
                    raise
                return None
            if offset >= size or max_bytes <= 0:
                return FileRead(data=b"", size=size, truncated=offset < size)
            return _bounded(sbx.files.read(full, format="stream"), size, offset, max_bytes)

        result: FileRead | None = self._call(sandbox_id, read)
        return result

    # -- lifecycle ---------------------------------------------------------------------

    def delete(self, sandbox_id: str) -> None:
        sdk = self._sdk()
        sdk.forget(sandbox_id)
        try:
            sdk.client.Sandbox.kill(sandbox_id)  # False when already gone: success too
        except Exception as exc:
            error = mapped(exc)
            if not isinstance(error, SandboxNotFoundError):
                raise error from exc

    def list(self, labels: Mapping[str, str]) -> builtins.list[SandboxRef]:
        sdk = self._sdk()
        query = SandboxQuery(
            metadata=dict(labels) or None, state=[SandboxState.RUNNING, SandboxState.PAUSED]
        )
        refs: builtins.list[SandboxRef] = []
        try:
            pages = sdk.client.Sandbox.list(query=query, limit=LIST_PAGE)
            for _ in range(MAX_LIST_PAGES):
                if not pages.has_next:
                    break
                for info in pages.next_items():
                    found = {str(k): str(v) for k, v in (info.metadata or {}).items()}
                    # The server filters; checking again costs nothing and trusts less.
                    if all(found.get(k) == v for k, v in labels.items()):
                        refs.append(
                            SandboxRef(
                                provider=self.name,
                                sandbox_id=info.sandbox_id,
                                labels=found,
                                created_at=info.started_at.timestamp(),
                            )
                        )
        except Exception as exc:
            raise mapped(exc) from exc
        return refs

    # -- plumbing ----------------------------------------------------------------------

    def _call(self, sandbox_id: str, action: Any) -> Any:
        """Runs action(sandbox handle); a gone sandbox is not found, all else mapped."""
        sdk = self._sdk()
        try:
            return action(sdk.handle(sandbox_id))
        except CommandExitException as exc:
            raise _Exited(exc.exit_code, str(exc.stderr or "")[:300]) from None
        except Exception as exc:
            error = mapped(exc)
            if isinstance(error, SandboxNotFoundError):
                sdk.forget(sandbox_id)
            raise error from exc


class _Exited(Exception):
    """A command of ours ended non-zero (kept apart from the SDK's errors)."""

    def __init__(self, exit_code: int, stderr: str) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code
        self.stderr = stderr


def _sandbox_gone(exc: BaseException) -> bool:
    return isinstance(exc, ex.SandboxNotFoundException)


def _bounded(stream: Any, size: int, offset: int, max_bytes: int) -> FileRead:
    """Reads [offset, offset + max_bytes) of a streamed download, then hangs up."""
    kept = bytearray()
    seen = 0
    try:
        for chunk in stream:
            start = max(0, offset - seen)
            seen += len(chunk)
            if start < len(chunk):
                kept += chunk[start : start + max_bytes - len(kept)]
            if len(kept) >= max_bytes:
                break
    finally:
        stream.close()
    return FileRead(
        data=bytes(kept), size=max(size, seen), truncated=offset + len(kept) < max(size, seen)
    )
