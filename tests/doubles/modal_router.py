"""The Modal double's task command router: exec inside a sandbox, as local processes.

The SDK ships the servicer base (modal_proto.task_command_router_grpc.TaskCommandRouterBase).
Output is kept per exec so a read from any offset (the SDK resumes that way) is served.
The SDK's filesystem API execs /__modal/.bin/modal-sandbox-fs-tools; here a stdlib
script stands in for that binary.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpclib import GRPCError, Status
from modal._utils.grpc_testing import patch_mock_servicer
from modal_proto import task_command_router_grpc
from modal_proto import task_command_router_pb2 as sr

from tests.doubles.modal_world import Box, World

FS_TOOLS = "/__modal/.bin/modal-sandbox-fs-tools"
FS_TOOLS_STANDIN = Path(__file__).with_name("modal_fs_tools.py")
Stream = Any


@dataclass
class Exec:
    proc: asyncio.subprocess.Process
    out: dict[int, bytearray] = field(default_factory=lambda: {1: bytearray(), 2: bytearray()})
    closed: dict[int, asyncio.Event] = field(default_factory=dict)
    grew: asyncio.Event = field(default_factory=asyncio.Event)
    stdin_offset: int = 0
    stdin_closed: bool = False


@patch_mock_servicer
class RouterServicer(task_command_router_grpc.TaskCommandRouterBase):  # type: ignore[misc]
    def __init__(self, world: World) -> None:
        self.world = world
        self.execs: dict[tuple[str, str], Exec] = {}

    def _exec(self, task_id: str, exec_id: str) -> tuple[Box, Exec]:
        box = self.world.by_task(task_id)
        try:
            return box, self.execs[(task_id, exec_id)]
        except KeyError:
            raise GRPCError(Status.NOT_FOUND, f"exec {exec_id} not found") from None

    async def TaskExecStart(self, stream: Stream) -> None:
        request: sr.TaskExecStartRequest = await stream.recv_message()
        box = self.world.by_task(request.task_id)
        env = dict(request.env)
        for source in request.secret_sources:
            env.update(source.env.contents)
        argv = [box.vmap(a) for a in request.command_args]
        if argv and argv[0] == FS_TOOLS:
            argv = [sys.executable, str(FS_TOOLS_STANDIN), *argv[1:]]
        pipe = asyncio.subprocess.PIPE
        devnull = asyncio.subprocess.DEVNULL
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=box.vmap(request.workdir) if request.workdir else box.root,
            env=self.world.process_env(box, env),
            stdin=pipe,
            stdout=devnull
            if request.stdout_config == sr.TaskExecStdoutConfig.TASK_EXEC_STDOUT_CONFIG_DEVNULL
            else pipe,
            stderr=devnull
            if request.stderr_config == sr.TaskExecStderrConfig.TASK_EXEC_STDERR_CONFIG_DEVNULL
            else pipe,
            start_new_session=True,
        )
        run = Exec(proc)
        self.execs[(request.task_id, request.exec_id)] = run
        box.execs[request.exec_id] = proc
        loop = asyncio.get_running_loop()
        for fd, pipe_out in ((1, proc.stdout), (2, proc.stderr)):
            run.closed[fd] = asyncio.Event()
            loop.create_task(self._pump(run, fd, pipe_out))
        if request.timeout_secs:
            loop.call_later(request.timeout_secs, _kill, proc)
        await stream.send_message(sr.TaskExecStartResponse())

    async def _pump(self, run: Exec, fd: int, pipe: asyncio.StreamReader | None) -> None:
        try:
            while pipe is not None:
                chunk = await pipe.read(65536)
                if not chunk:
                    break
                run.out[fd] += chunk
                run.grew.set()
        finally:
            run.closed[fd].set()
            run.grew.set()

    async def TaskExecStdioRead(self, stream: Stream) -> None:
        request: sr.TaskExecStdioReadRequest = await stream.recv_message()
        _box, run = self._exec(request.task_id, request.exec_id)
        fd = (
            1
            if request.file_descriptor
            == sr.TaskExecStdioFileDescriptor.TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDOUT
            else 2
        )
        offset = request.offset
        while True:
            data = bytes(run.out[fd][offset:])
            if data:
                await stream.send_message(sr.TaskExecStdioReadResponse(data=data))
                offset += len(data)
                continue
            if run.closed[fd].is_set():
                return
            run.grew.clear()
            await run.grew.wait()

    async def TaskExecStdinWriteStream(self, stream: Stream) -> None:
        first: sr.TaskExecStdinWriteStreamRequest = await stream.recv_message()
        if first.WhichOneof("payload") != "start":
            raise GRPCError(Status.INVALID_ARGUMENT, "the first message must be start")
        _box, run = self._exec(first.start.task_id, first.start.exec_id)
        if first.start.offset != run.stdin_offset:
            raise GRPCError(Status.FAILED_PRECONDITION, "stdin offset mismatch")
        async for message in stream:
            if message.WhichOneof("payload") == "end":
                self._close_stdin(run)
                break
            await self._write(run, message.data)
        await stream.send_message(sr.TaskExecStdinWriteStreamResponse())

    async def TaskExecStdinWrite(self, stream: Stream) -> None:
        request: sr.TaskExecStdinWriteRequest = await stream.recv_message()
        _box, run = self._exec(request.task_id, request.exec_id)
        if request.offset == run.stdin_offset and request.data:
            await self._write(run, request.data)
        if request.eof:
            self._close_stdin(run)
        await stream.send_message(sr.TaskExecStdinWriteResponse())

    async def TaskExecStdinStatus(self, stream: Stream) -> None:
        request: sr.TaskExecStdinStatusRequest = await stream.recv_message()
        _box, run = self._exec(request.task_id, request.exec_id)
        await stream.send_message(
            sr.TaskExecStdinStatusResponse(
                num_bytes_written=run.stdin_offset, closed=run.stdin_closed
            )
        )

    async def _write(self, run: Exec, data: bytes) -> None:
        stdin = run.proc.stdin
        if stdin is not None and data:
            with contextlib.suppress(ConnectionError):
                stdin.write(data)
                await stdin.drain()
        run.stdin_offset += len(data)

    def _close_stdin(self, run: Exec) -> None:
        if run.proc.stdin is not None:
            with contextlib.suppress(Exception):
                run.proc.stdin.close()
        run.stdin_closed = True

    async def TaskExecPoll(self, stream: Stream) -> None:
        request: sr.TaskExecPollRequest = await stream.recv_message()
        _box, run = self._exec(request.task_id, request.exec_id)
        code = run.proc.returncode
        await stream.send_message(
            sr.TaskExecPollResponse() if code is None else sr.TaskExecPollResponse(code=code)
        )

    async def TaskExecWait(self, stream: Stream) -> None:
        request: sr.TaskExecWaitRequest = await stream.recv_message()
        box, run = self._exec(request.task_id, request.exec_id)
        waiter = asyncio.ensure_future(run.proc.wait())
        ended = asyncio.ensure_future(box.ended.wait())
        await asyncio.wait({waiter, ended}, return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        # The router of a sandbox that ended answers NOT_FOUND, whatever its exec's code.
        if run.proc.returncode is None or box.result is not None:
            waiter.cancel()
            raise GRPCError(Status.NOT_FOUND, f"Task {request.task_id} has finished")
        await stream.send_message(sr.TaskExecWaitResponse(code=run.proc.returncode))


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
