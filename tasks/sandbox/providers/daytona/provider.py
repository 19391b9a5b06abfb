"""The Daytona adapter: one ephemeral sandbox per attempt, named by its key.

Control plane: the SDK's REST client (api_url from DAYTONA_API_URL). Inside the sandbox:
the toolbox API (files and a shell command), through which the boot script starts the
runner detached and reports on it. docs/providers/daytona.md tells what each call maps to.
"""

from __future__ import annotations

import builtins
import ipaddress
import logging
import math
import os
import shlex
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeVar

from daytona import (
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaConfig,
    FileUpload,
    ListSandboxesQuery,
    Sandbox,
    SandboxState,
)

from tasks.sandbox.base import (
    ExitReport,
    FileRead,
    ProcessStatus,
    ProviderError,
    SandboxNotFoundError,
    SandboxRef,
    SandboxSpec,
    TransportError,
)
from tasks.sandbox.providers import bootstrap
from tasks.sandbox.providers.daytona.errors import (
    answer_lost,
    is_conflict,
    is_not_found,
    translate,
)

if TYPE_CHECKING:
    from tasks.settings import Settings

T = TypeVar("T")
log = logging.getLogger("playrun.sandbox.daytona")

WORKDIR = bootstrap.WORKDIR
# The SDK adds this label to every sandbox it creates; it is not one of ours.
LANGUAGE_LABEL = "code-toolbox-language"
GONE = frozenset({SandboxState.DESTROYED, SandboxState.DESTROYING})
# States a sandbox passes through on its way to `started`: worth waiting for.
ON_THE_WAY = frozenset(
    {
        SandboxState.CREATING,
        SandboxState.STARTING,
        SandboxState.RESTORING,
        SandboxState.PENDING_BUILD,
        SandboxState.BUILDING_SNAPSHOT,
        SandboxState.PULLING_SNAPSHOT,
    }
)
# The boot script's answer when a runner was started here already (exec retried).
ALREADY_STARTED = 3
PAGE = 200  # the API's largest list page
MAX_OUTPUT = 300  # characters of a failed command's output kept in the error


def _call(fn: Callable[[], T]) -> T:
    """Run one SDK call; whatever it raises leaves as a ProviderError."""
    try:
        return fn()
    except Exception as exc:
        raise translate(exc) from exc


def _new_client(config: Mapping[str, Any]) -> Daytona:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # Polling, not the socket.io event stream: no background socket per worker process.
        return Daytona(DaytonaConfig(use_deprecated_polling=True, **config))


def _sh(command: str) -> str:
    # Older daemons split the command on spaces themselves; one quoted word survives both.
    return f"sh -c {shlex.quote(command)}"


def _inside(path: str) -> str:
    """A path under the workdir, refused if it could leave it."""
    parts = PurePosixPath(path).parts
    if not parts or PurePosixPath(path).is_absolute() or ".." in parts:
        raise ProviderError(f"path {path[:200]!r} is not inside the sandbox's workdir")
    return f"{WORKDIR}/{PurePosixPath(*parts)}"


def egress_params(hosts: tuple[str, ...] | None) -> dict[str, Any]:
    """Daytona's egress settings for a host list: IPv4 as CIDRs, names as domains."""
    if hosts is None:
        return {}
    if not hosts:
        return {"network_block_all": True}
    cidrs, domains = [], []
    for host in hosts:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            domains.append(host)
            continue
        if address.version != 4:
            return {}  # the allow list takes IPv4 only: blocking would cut the gateway off
        cidrs.append(f"{address}/32")
    params: dict[str, Any] = {}
    if cidrs:
        params["network_allow_list"] = ",".join(cidrs)
    if domains:
        params["domain_allow_list"] = ",".join(domains)
    return params


def _created_at(box: Sandbox) -> float:
    raw = box.created_at
    if raw:
        try:
            return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return time.time()


class DaytonaProvider:
    name = "daytona"
    # daytona.io/docs/en/rate-limits: 600 sandbox creates per minute per organisation.
    create_rate_per_min: float | None = 600.0
    create_timeout_s: float = 60.0  # the create call, until the sandbox is started
    request_timeout_s: float = 30.0  # every other call
    exec_timeout_s: int = 30  # the boot script answers once the runner is on record
    reports_exit = True  # the boot script reports the runner's exit (playrun_boot.py)

    def __init__(self, root: Path, *, settings: Settings | None = None) -> None:
        self.root = Path(root)
        self.settings = settings
        self._lock = threading.Lock()
        self._client: tuple[int, Daytona] | None = None

    def _daytona(self) -> Daytona:
        # One client per process: its connection pools must not cross a fork.
        with self._lock:
            if self._client is None or self._client[0] != os.getpid():
                config = self._config()
                self._client = (os.getpid(), _call(lambda: _new_client(config)))
            return self._client[1]

    def _config(self) -> dict[str, Any]:
        """DaytonaConfig fields; none by default: the SDK reads DAYTONA_API_KEY/_URL itself."""
        return {}

    def _params(self, spec: SandboxSpec) -> CreateSandboxFromSnapshotParams:
        lifetime: dict[str, Any] = {}
        if spec.lifetime_s is not None:
            # Auto-stop counts API activity, not work inside: the TTL is the only cap.
            lifetime = {
                "auto_stop_interval": 0,
                "ttl_minutes": max(1, math.ceil(spec.lifetime_s / 60)),
            }
        return CreateSandboxFromSnapshotParams(
            name=spec.key or None,
            labels=dict(spec.labels),
            language="python",
            ephemeral=True,
            **lifetime,
            **egress_params(spec.egress_hosts),
        )

    def create(self, spec: SandboxSpec) -> SandboxRef:
        client = self._daytona()
        try:
            box = client.create(self._params(spec), timeout=self.create_timeout_s)
        except Exception as exc:
            if spec.key and is_conflict(exc):
                box = self._adopt(client, spec.key)
            elif spec.key and answer_lost(exc):
                raise TransportError(
                    f"the create of {spec.key} lost its answer; a retry with its key finds "
                    f"the sandbox: {translate(exc).message}"
                ) from exc
            else:
                self._drop_unnamed(client, exc)
                raise translate(exc) from exc
        try:
            self._upload(box, bootstrap.files_for(spec))
        except ProviderError:
            if not spec.key:  # nothing could find it again
                self._forget(box)
            raise
        return self._ref(box)

    def _adopt(self, client: Daytona, key: str) -> Sandbox:
        """The sandbox an earlier create with this key made, once it is started."""
        box = _call(lambda: client.get(key, request_timeout=self.request_timeout_s))
        if box.state in ON_THE_WAY:
            _call(lambda: box.wait_for_sandbox_start(timeout=self.create_timeout_s))
        if box.state != SandboxState.STARTED:
            if box.state not in GONE:
                self._forget(box)
            raise TransportError(f"sandbox {key} is {box.state}; it is being deleted")
        return box

    def _drop_unnamed(self, client: Daytona, exc: Exception) -> None:
        # An unnamed sandbox that outlived its create's timeout can only be found by its id.
        sandbox_id = getattr(exc, "sandbox_id", None)
        if isinstance(sandbox_id, str) and sandbox_id:
            try:
                self._forget(client.get(sandbox_id, request_timeout=self.request_timeout_s))
            except Exception:  # its TTL and GC by labels remain
                log.warning(
                    "sandbox %s outlived its create; not deleted", sandbox_id, exc_info=True
                )

    def _forget(self, box: Sandbox) -> None:
        try:
            box.delete(timeout=self.request_timeout_s)
        except Exception:  # its TTL and GC by labels remain
            log.warning("sandbox %s could not be deleted", box.id, exc_info=True)

    def _upload(self, box: Sandbox, files: Mapping[str, bytes]) -> None:
        uploads = [
            FileUpload(source=bytes(data), destination=_inside(name))
            for name, data in files.items()
        ]
        _call(lambda: box.fs.upload_files(uploads, timeout=int(self.request_timeout_s)))

    def _ref(self, box: Sandbox) -> SandboxRef:
        labels = {k: v for k, v in (box.labels or {}).items() if k != LANGUAGE_LABEL}
        return SandboxRef(
            provider=self.name, sandbox_id=box.id, labels=labels, created_at=_created_at(box)
        )

    def _box(self, sandbox_id: str) -> Sandbox:
        client = self._daytona()
        box = _call(lambda: client.get(sandbox_id, request_timeout=self.request_timeout_s))
        if box.state in GONE:
            raise SandboxNotFoundError(f"sandbox {sandbox_id} is {box.state}")
        return box

    def _exec(self, box: Sandbox, command: str) -> tuple[int, str]:
        answer = _call(lambda: box.process.exec(_sh(command), timeout=self.exec_timeout_s))
        code = answer.exit_code if isinstance(answer.exit_code, int) else -1
        return code, answer.result or ""

    def exec_detached(
        self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float,
        report: ExitReport | None = None,
    ) -> None:
        box = self._box(sandbox_id)
        # The toolbox's exec takes no env every daemon honours: a file the boot script
        # reads and deletes carries it (tokens never appear in a command line).
        self._upload(box, {bootstrap.ENV_FILE: bootstrap.env_json(env, report)})
        command = bootstrap.start_command(
            WORKDIR, argv, timeout_s=timeout_s, env_file=bootstrap.ENV_FILE
        )
        code, output = self._exec(box, command)
        if code not in (0, ALREADY_STARTED):  # a retried exec finds its runner started
            raise ProviderError(
                f"the runner did not start in {sandbox_id} (exit {code}): {output[:MAX_OUTPUT]}"
            )

    def poll(self, sandbox_id: str) -> ProcessStatus:
        box = self._box(sandbox_id)
        code, output = self._exec(box, bootstrap.status_command(WORKDIR))
        if code != 0:
            raise ProviderError(
                f"the status of {sandbox_id} is unreadable (exit {code}): {output[:MAX_OUTPUT]}"
            )
        return bootstrap.parse_status(output)

    def read_file(
        self, sandbox_id: str, path: str, *, offset: int = 0, max_bytes: int
    ) -> FileRead | None:
        if offset < 0 or max_bytes < 0:
            raise ProviderError("offset and max_bytes must not be negative")
        remote = _inside(path)
        box = self._box(sandbox_id)
        try:
            info = box.fs.get_file_info(remote, request_timeout=self.request_timeout_s)
            if info.is_dir:
                return None
            if offset >= info.size or max_bytes == 0:
                return FileRead(data=b"", size=info.size, truncated=offset < info.size)
            data = self._download(box, remote, offset, max_bytes)
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise translate(exc) from exc
        return FileRead(data=data, size=info.size, truncated=offset + len(data) < info.size)

    def _download(self, box: Sandbox, remote: str, offset: int, max_bytes: int) -> bytes:
        """At most max_bytes from offset; the stream is closed as soon as they are in."""
        kept = bytearray()
        seen = 0
        stream = box.fs.download_file_stream(remote, timeout=int(self.request_timeout_s))
        try:
            for chunk in stream:
                skip = max(offset - seen, 0)
                seen += len(chunk)
                if skip < len(chunk):
                    kept += chunk[skip : skip + max_bytes - len(kept)]
                if len(kept) >= max_bytes:
                    break
        finally:
            close = getattr(stream, "close", None)
            if callable(close):
                close()
        return bytes(kept)

    def delete(self, sandbox_id: str) -> None:
        client = self._daytona()
        try:
            box = client.get(sandbox_id, request_timeout=self.request_timeout_s)
            if box.state not in GONE:
                box.delete(timeout=self.request_timeout_s)
        except Exception as exc:
            if is_not_found(exc):
                return
            raise translate(exc) from exc

    def list(self, labels: Mapping[str, str]) -> builtins.list[SandboxRef]:
        client = self._daytona()
        query = ListSandboxesQuery(labels=dict(labels) or None, limit=PAGE)

        def every() -> builtins.list[SandboxRef]:
            return [
                self._ref(box)
                for box in client.list(query, request_timeout=self.request_timeout_s)
                if box.state not in GONE
            ]

        return _call(every)
