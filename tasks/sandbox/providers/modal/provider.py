"""Modal sandboxes on the official SDK (modal 1.6, gRPC).

The runner is the sandbox's entrypoint: a process started later with `exec` can be
watched only by the worker that started it, while the entrypoint's end is the
sandbox's end, which any worker can read. create() uploads the files and leaves the
entrypoint waiting; exec_detached() writes the launch file that starts the runner.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import ipaddress
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import modal
import modal.exception as mx

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
from tasks.sandbox.providers.modal import commands
from tasks.sandbox.providers.modal.session import Options, Session, session
from tasks.sandbox.providers.modal.tags import creation_tags, from_tags, sandbox_name, to_tags

if TYPE_CHECKING:
    from tasks.settings import Settings

APP_NAME = "playrun"
IMAGE = "python:3.12-slim"
# Modal's default sandbox timeout, and its cap (24 h).
DEFAULT_LIFETIME_S = 300
MAX_LIFETIME_S = 24 * 3600
# Tags of listed sandboxes are fetched one RPC each: this many at a time.
TAG_FETCHES = 16


class ModalProvider:
    name = "modal"
    # Modal publishes no sandbox create-rate limit (modal.com/docs/guide/sandbox,
    # modal.com/docs/guide/resources, late 2026): the start-rate bucket learns it.
    create_rate_per_min: float | None = None
    reports_exit = True  # the boot script reports the runner's exit (playrun_boot.py)

    def __init__(
        self,
        root: Path,
        *,
        settings: Settings | None = None,
        environ: Mapping[str, str] | None = None,
        app_name: str = APP_NAME,
        image: str = IMAGE,
        workdir: str = bootstrap.WORKDIR,
        create_timeout_s: float = 120.0,
        call_timeout_s: float = 60.0,
        linger_s: float = 300.0,
    ) -> None:
        self.root = Path(root)
        self.settings = settings
        self.options = Options(
            app_name=app_name,
            image=image,
            environ=tuple(sorted(environ.items())) if environ else None,
        )
        self.workdir = workdir.rstrip("/")
        self.create_timeout_s = create_timeout_s
        self.call_timeout_s = call_timeout_s
        # How long a finished runner's sandbox stays readable (exit record, result file).
        self.linger_s = linger_s

    def _session(self) -> Session:
        return session(self.options)

    # -- create -------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxRef:
        s = self._session()
        name = sandbox_name(spec.key)
        created_at = time.time()
        sandbox, labels, created = s.call(
            lambda: self._create_or_adopt(s, spec, name, created_at),
            doing="create",
            timeout_s=self.create_timeout_s,
        )
        try:
            s.call(
                lambda: self._upload(sandbox, spec), doing="upload", timeout_s=self.call_timeout_s
            )
        except ProviderError:
            if name is None:  # nothing could find it again: do not leave it running
                self._terminate_quietly(s, sandbox)
            raise  # with a key, the create's retry adopts it and uploads again
        return SandboxRef(self.name, sandbox.object_id, labels, created)

    async def _create_or_adopt(
        self, s: Session, spec: SandboxSpec, name: str | None, created_at: float
    ) -> tuple[Any, dict[str, str], float]:
        client = await s.client()
        app = await s.app()
        cidrs, domains = egress(spec.egress_hosts)
        try:
            sandbox = await modal.Sandbox.create.aio(
                *commands.entrypoint(
                    self.workdir, timeout_s=spec.lifetime_s or 3600.0, linger_s=self.linger_s
                ),
                app=app,
                image=s.image(),
                name=name,
                tags=creation_tags(spec.labels, created_at),
                memory=(spec.memory_mb, spec.memory_mb),
                timeout=lifetime(spec),
                outbound_cidr_allowlist=cidrs,
                outbound_domain_allowlist=domains,
                client=client,
            )
            return sandbox, dict(spec.labels), created_at
        except mx.AlreadyExistsError:
            if name is None:
                raise
        # Our own key: an earlier create of this attempt made it (its answer was lost).
        sandbox = await modal.Sandbox.from_name.aio(self.options.app_name, name, client=client)
        labels, created = from_tags(await sandbox.get_tags.aio())
        return sandbox, labels, created or created_at

    async def _upload(self, sandbox: Any, spec: SandboxSpec) -> None:
        # One round trip per file, all in flight at once: the files are independent.
        write = sandbox.filesystem.write_bytes.aio
        await asyncio.gather(*(
            write(data, f"{self.workdir}/{commands.safe_relative(rel)}")
            for rel, data in bootstrap.files_for(spec).items()))

    def _terminate_quietly(self, s: Session, sandbox: Any) -> None:
        # If this fails too, its hard lifetime ends it; GC lists it by its labels meanwhile.
        with contextlib.suppress(ProviderError):
            s.call(
                lambda: sandbox.terminate.aio(), doing="terminate", timeout_s=self.call_timeout_s
            )

    # -- the runner ---------------------------------------------------------------------

    def exec_detached(
        self, sandbox_id: str, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float,
        report: ExitReport | None = None,
    ) -> None:
        s = self._session()
        launch = bootstrap.launch_json(argv, env, timeout_s, report)

        async def go() -> None:
            sandbox = await self._running(s, sandbox_id)
            await sandbox.filesystem.write_bytes.aio(
                launch, f"{self.workdir}/{bootstrap.LAUNCH_FILE}"
            )

        s.call(go, doing="launch", timeout_s=self.call_timeout_s)

    def poll(self, sandbox_id: str) -> ProcessStatus:
        s = self._session()

        async def go() -> ProcessStatus:
            sandbox = await modal.Sandbox.from_id.aio(sandbox_id, client=await s.client())
            if sandbox.returncode is not None:
                return _ended(sandbox.returncode)
            try:
                out = await self._exec(sandbox, commands.status_argv(self.workdir))
            except (mx.NotFoundError, ProviderError):
                # The entrypoint may have ended (its filesystem with it) since the lookup,
                # killing the status command: then the sandbox's end is the answer.
                again = await modal.Sandbox.from_id.aio(sandbox_id, client=await s.client())
                if again.returncode is None:
                    raise
                return _ended(again.returncode)
            return commands.parse_status(out)

        return s.call(go, doing="poll", timeout_s=self.call_timeout_s)

    def read_file(
        self, sandbox_id: str, path: str, *, offset: int = 0, max_bytes: int
    ) -> FileRead | None:
        argv = commands.read_argv(self.workdir, path, offset, max_bytes)
        s = self._session()

        async def go() -> FileRead | None:
            sandbox = await self._running(s, sandbox_id)
            return commands.parse_read(await self._exec(sandbox, argv), offset, max_bytes)

        return s.call(go, doing="read file", timeout_s=self.call_timeout_s)

    async def _running(self, s: Session, sandbox_id: str) -> Any:
        sandbox = await modal.Sandbox.from_id.aio(sandbox_id, client=await s.client())
        if sandbox.returncode is not None:
            raise SandboxNotFoundError(
                f"modal sandbox {sandbox_id} has ended (exit {sandbox.returncode}): "
                "its filesystem is gone"
            )
        return sandbox

    async def _exec(self, sandbox: Any, argv: Sequence[str]) -> bytes:
        process = await sandbox.exec.aio(
            *argv, timeout=max(1, int(self.call_timeout_s)), text=False
        )
        out, err, code = await asyncio.gather(
            process.stdout.read.aio(), process.stderr.read.aio(), process.wait.aio()
        )
        if code != 0:
            raise ProviderError(
                f"modal exec {argv[0]!r} exited {code}: "
                f"{bytes(err)[:200].decode('utf-8', 'replace')}"
            )
        return bytes(out)

    # -- delete and list ----------------------------------------------------------------

    def delete(self, sandbox_id: str) -> None:
        s = self._session()

        async def go() -> None:
            try:
                sandbox = await modal.Sandbox.from_id.aio(sandbox_id, client=await s.client())
                await sandbox.terminate.aio()  # a no-op once it has finished
            except mx.NotFoundError:
                return

        s.call(go, doing="delete", timeout_s=self.call_timeout_s)

    def list(self, labels: Mapping[str, str]) -> builtins.list[SandboxRef]:
        s = self._session()

        async def go() -> builtins.list[SandboxRef]:
            client = await s.client()
            app = await s.app()
            handles = [
                sb
                async for sb in modal.Sandbox.list.aio(
                    app_id=app.app_id, tags=to_tags(labels), client=client
                )
            ]
            gate = asyncio.Semaphore(TAG_FETCHES)

            async def ref(sandbox: Any) -> SandboxRef | None:
                async with gate:
                    try:
                        tags = await sandbox.get_tags.aio()
                    except mx.NotFoundError:
                        return None  # ended between its page and its tags
                found, created = from_tags(tags)
                return SandboxRef(self.name, sandbox.object_id, found, created)

            refs = await asyncio.gather(*(ref(sb) for sb in handles))
            return [
                r
                for r in refs
                if r is not None and all(r.labels.get(k) == v for k, v in labels.items())
            ]

        return s.call(go, doing="list", timeout_s=self.call_timeout_s * 4)


def _ended(returncode: int | None) -> ProcessStatus:
    """An ended sandbox took its exit record with it; Modal's 124 is its lifetime running out."""
    return ProcessStatus(state="missing", timed_out=returncode == 124)


def lifetime(spec: SandboxSpec) -> int:
    if spec.lifetime_s is None:
        return DEFAULT_LIFETIME_S
    return max(1, min(MAX_LIFETIME_S, math.ceil(spec.lifetime_s)))


def egress(hosts: tuple[str, ...] | None) -> tuple[list[str] | None, list[str] | None]:
    """Modal's outbound allowlists (CIDRs, domains): addresses as CIDRs, names as domains;
    () allows nothing; None leaves egress open."""
    if hosts is None:
        return None, None
    cidrs: list[str] = []
    domains: list[str] = []
    for host in hosts:
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            domains.append(host.lower().rstrip("."))
            continue
        cidrs.append(f"{ip}/{ip.max_prefixlen}")
    return cidrs, domains or None
