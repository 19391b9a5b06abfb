"""envd in the E2B double: the Process and Filesystem connect-rpc services (on the
server classes the SDK wheel ships) and the HTTP /files and /health routes.

Commands run as real local processes in the sandbox's directory, so a runner started
here really calls the gateway. As in envd, a Start stream's deadline (the SDK's
`timeout`, 60 s by default) kills the command it started; a closed stream does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.parser
import email.policy
import json
import os
import signal
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_connect, filesystem_pb
from e2b.envd.process import process_connect, process_pb
from protobuf import Oneof

from tests.doubles.e2b_state import Box, World

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Event = process_pb.ProcessEvent


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}


def _box_for(world: World, headers: Any) -> Box:
    box = world.box(headers.get("e2b-sandbox-id", ""))
    if box is None:
        raise ConnectError(Code.UNAVAILABLE, "The sandbox was not found")
    if headers.get("x-access-token") != box.token:
        raise ConnectError(Code.UNAUTHENTICATED, "invalid access token")
    return box


def _event(field: str, value: Any) -> Event:
    return Event(event=Oneof(field, value))  # type: ignore[arg-type]


class ProcessService(process_connect.Process):
    def __init__(self, world: World) -> None:
        self.world = world

    async def start(
        self, request: process_pb.StartRequest, ctx: Any
    ) -> AsyncIterator[process_pb.StartResponse]:
        box = _box_for(self.world, ctx.request_headers)
        cfg = request.process or process_pb.ProcessConfig()
        argv = [box.rewrite(cfg.cmd), *(box.rewrite(a) for a in cfg.args)]
        cwd = box.local(cfg.cwd) if cfg.has_field("cwd") and cfg.cwd else box.root
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=str(cwd),
            env=self.world.proc_env(box, dict(cfg.envs)),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        box.procs[proc.pid] = (proc, cfg)
        deadline = ctx.timeout_ms
        self.world.started.append((" ".join(argv), deadline))
        killer = None
        if deadline:
            killer = asyncio.get_running_loop().call_later(deadline / 1000, _kill_group, proc.pid)
        queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()
        readers = [
            asyncio.create_task(_pump(proc.stdout, "stdout", queue)),
            asyncio.create_task(_pump(proc.stderr, "stderr", queue)),
        ]
        interval = float(ctx.request_headers.get("keepalive-ping-interval") or 50)
        ended = False
        try:
            yield process_pb.StartResponse(event=_event("start", Event.StartEvent(pid=proc.pid)))
            open_pipes = 2
            while open_pipes:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=interval)
                except TimeoutError:
                    yield process_pb.StartResponse(event=_event("keepalive", Event.KeepAlive()))
                    continue
                if item is None:
                    open_pipes -= 1
                    continue
                data = Event.DataEvent(output=Oneof(item[0], item[1]))  # type: ignore[arg-type]
                yield process_pb.StartResponse(event=_event("data", data))
            code = await proc.wait()
            ended = True
            box.procs.pop(proc.pid, None)
            status = f"exit status {code}" if code >= 0 else f"signal: {signal.Signals(-code).name}"
            end = Event.EndEvent(
                exit_code=code if code >= 0 else -1, exited=code >= 0, status=status
            )
            yield process_pb.StartResponse(event=_event("end", end))
        finally:
            if killer is not None and ended:
                killer.cancel()
            if not ended:  # the client went away: the command goes on, its output drained
                asyncio.get_running_loop().create_task(_reap(box, proc, readers))

    async def list(self, request: process_pb.ListRequest, ctx: Any) -> process_pb.ListResponse:
        box = _box_for(self.world, ctx.request_headers)
        return process_pb.ListResponse(
            processes=[
                process_pb.ProcessInfo(config=cfg, pid=pid) for pid, (_, cfg) in box.procs.items()
            ]
        )

    async def send_signal(
        self, request: process_pb.SendSignalRequest, ctx: Any
    ) -> process_pb.SendSignalResponse:
        box = _box_for(self.world, ctx.request_headers)
        selector = request.process.selector if request.process else None
        pid = selector.value if selector is not None and selector.field == "pid" else None
        if pid not in box.procs:
            raise ConnectError(Code.NOT_FOUND, f"process with pid {pid} not found")
        sig = signal.SIGTERM if request.signal == process_pb.Signal.SIGTERM else signal.SIGKILL
        with contextlib.suppress(OSError):
            os.kill(int(pid), sig)
        return process_pb.SendSignalResponse()


async def _pump(
    stream: asyncio.StreamReader | None, name: str, queue: asyncio.Queue[tuple[str, bytes] | None]
) -> None:
    try:
        while stream is not None and (chunk := await stream.read(32768)):
            await queue.put((name, chunk))
    finally:
        await queue.put(None)


async def _reap(
    box: Box, proc: asyncio.subprocess.Process, readers: list[asyncio.Task[None]]
) -> None:
    await asyncio.gather(*readers, return_exceptions=True)
    await proc.wait()
    box.procs.pop(proc.pid, None)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


class FilesystemService(filesystem_connect.Filesystem):
    def __init__(self, world: World) -> None:
        self.world = world

    async def stat(
        self, request: filesystem_pb.StatRequest, ctx: Any
    ) -> filesystem_pb.StatResponse:
        box = _box_for(self.world, ctx.request_headers)
        local = box.local(request.path)
        try:
            st = local.stat()
        except FileNotFoundError:
            raise ConnectError(
                Code.NOT_FOUND, f"no such file or directory: {request.path}"
            ) from None
        kind = (
            filesystem_pb.FileType.DIRECTORY
            if stat.S_ISDIR(st.st_mode)
            else filesystem_pb.FileType.FILE
        )
        return filesystem_pb.StatResponse(
            entry=filesystem_pb.EntryInfo(
                name=local.name,
                type=kind,
                path=request.path,
                size=st.st_size,
                mode=stat.S_IMODE(st.st_mode),
                permissions=stat.filemode(st.st_mode),
                owner="user",
                group="user",
            )
        )


class Envd:
    """envd's routes: connect-rpc by path prefix, the rest plain HTTP."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.process = process_connect.ProcessASGIApplication(ProcessService(world))
        self.filesystem = filesystem_connect.FilesystemASGIApplication(FilesystemService(world))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        if path.startswith("/process.Process/"):
            return await self.process(scope, receive, send)  # type: ignore[arg-type]
        if path.startswith("/filesystem.Filesystem/"):
            return await self.filesystem(scope, receive, send)  # type: ignore[arg-type]
        headers = _headers(scope)
        box = self.world.box(headers.get("e2b-sandbox-id", ""))
        if box is None:  # what the proxy in front of envd answers for a gone sandbox
            return await reply(send, 502, {"code": 502, "message": "The sandbox was not found"})
        if path == "/health":
            return await reply(send, 204, None)
        if headers.get("x-access-token") != box.token:
            return await reply(send, 401, {"code": 401, "message": "invalid access token"})
        if path != "/files":
            return await reply(send, 404, {"code": 404, "message": "no such route"})
        query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        if scope["method"] == "GET":
            local = box.local(query.get("path", ""))
            if not local.is_file():
                return await reply(send, 404, {"code": 404, "message": "file not found"})
            return await reply(send, 200, local.read_bytes(), "application/octet-stream")
        body = await read_body(receive)
        written = []
        if headers.get("content-type", "").startswith("multipart/form-data"):
            for name, data in _multipart(headers["content-type"], body):
                written.append(_write(box, name, data))
        else:
            written.append(_write(box, query.get("path", ""), body))
        return await reply(send, 200, written)


def _write(box: Box, path: str, data: bytes) -> dict[str, str]:
    local = box.local(path)
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(data)
    return {"name": local.name, "type": "file", "path": path}


def _multipart(content_type: str, body: bytes) -> list[tuple[str, bytes]]:
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    parts = []
    for part in message.iter_parts():  # type: ignore[attr-defined]
        name = part.get_filename() or ""
        parts.append((name, part.get_payload(decode=True) or b""))
    return parts


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def reply(
    send: Send,
    status: int,
    body: Any,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> None:
    raw = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    head = [(b"content-type", content_type.encode()), (b"content-length", str(len(raw)).encode())]
    head += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": raw})
