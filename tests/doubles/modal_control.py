"""The Modal double's control plane: the ModalClient RPCs the SDK's sandbox calls use.

The SDK ships the servicer base (modal_proto.api_grpc.ModalClientBase);
patch_mock_servicer answers every RPC not written here with UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from google.protobuf.empty_pb2 import Empty
from grpclib import GRPCError, Status
from modal._utils.grpc_testing import patch_mock_servicer
from modal_proto import api_grpc, api_pb2

from tests.doubles.modal_world import Box, World, jwt

IMAGE_BUILDER_VERSION = "2026.10"
Stream = Any  # grpclib.server.Stream, generic over two message types


def _result(box: Box) -> api_pb2.GenericResult | None:
    return box.result


@patch_mock_servicer
class ControlServicer(api_grpc.ModalClientBase):  # type: ignore[misc]
    def __init__(self, world: World) -> None:
        self.world = world

    async def _request(self, stream: Stream) -> Any:
        request = await stream.recv_message()
        self.world.check_token(stream.metadata)
        return request

    async def ClientHello(self, stream: Stream) -> None:
        await self._request(stream)
        await stream.send_message(api_pb2.ClientHelloResponse())

    async def AuthTokenGet(self, stream: Stream) -> None:
        await self._request(stream)
        await stream.send_message(api_pb2.AuthTokenGetResponse(token=jwt()))

    async def EnvironmentGetOrCreate(self, stream: Stream) -> None:
        request = await self._request(stream)
        settings = api_pb2.EnvironmentSettings(image_builder_version=IMAGE_BUILDER_VERSION)
        await stream.send_message(
            api_pb2.EnvironmentGetOrCreateResponse(
                environment_id="en-main",
                metadata=api_pb2.EnvironmentMetadata(
                    name=request.deployment_name or "main", settings=settings
                ),
            )
        )

    async def AppGetOrCreate(self, stream: Stream) -> None:
        request = await self._request(stream)
        key = (request.environment_name or "main", request.app_name)
        app_id = self.world.apps.get(key)
        if app_id is None:
            if request.object_creation_type != api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING:
                raise GRPCError(Status.NOT_FOUND, f"App '{request.app_name}' not found")
            app_id = self.world.apps[key] = f"ap-{len(self.world.apps) + 1:022d}"
        await stream.send_message(api_pb2.AppGetOrCreateResponse(app_id=app_id))

    async def ImageGetOrCreate(self, stream: Stream) -> None:
        await self._request(stream)
        done = api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_SUCCESS)
        await stream.send_message(
            api_pb2.ImageGetOrCreateResponse(
                image_id="im-python",
                result=done,
                metadata=api_pb2.ImageMetadata(image_builder_version=IMAGE_BUILDER_VERSION),
            )
        )

    async def SandboxCreateV2(self, stream: Stream) -> None:
        request: api_pb2.SandboxCreateV2Request = await self._request(stream)
        world = self.world
        world.requests.append(request)
        if world.create_latency_s:
            await asyncio.sleep(world.create_latency_s)
        world.admit_create(time.time())
        definition = request.definition
        if definition.name and world.running_named(request.app_id, definition.name):
            raise GRPCError(
                Status.ALREADY_EXISTS, f"Sandbox with name '{definition.name}' already exists"
            )
        env: dict[str, str] = {}
        for source in request.secret_sources:
            env.update(source.env.contents)
        tags = {t.tag_name: t.tag_value for t in request.tags}
        box = world.new_box(request.app_id, definition, env, tags)
        await world.start_entry(box, list(definition.entrypoint_args))
        if world.lose_answers:
            world.lose_answers -= 1
            # Made, but the answer comes after the client has given up on it.
            await asyncio.sleep(world.lost_answer_delay_s)
        with contextlib.suppress(Exception):  # the client may be gone
            await stream.send_message(
                api_pb2.SandboxCreateV2Response(
                    sandbox_id=box.id,
                    task_id=box.task_id,
                    metadata=api_pb2.SandboxHandleMetadata(app_id=box.app_id),
                    command_router_access=api_pb2.CommandRouterAccess(
                        url=world.router_url, jwt=jwt()
                    ),
                )
            )

    async def SandboxGetCommandRouterAccess(self, stream: Stream) -> None:
        request = await self._request(stream)
        box = self.world.get(request.sandbox_id) if request.sandbox_id else None
        if box is not None and box.result is not None:
            raise GRPCError(Status.FAILED_PRECONDITION, "Sandbox has already finished")
        await stream.send_message(
            api_pb2.SandboxGetCommandRouterAccessResponse(url=self.world.router_url, jwt=jwt())
        )

    async def SandboxGetTaskIdV2(self, stream: Stream) -> None:
        request = await self._request(stream)
        box = self.world.get(request.sandbox_id)
        await stream.send_message(
            api_pb2.SandboxGetTaskIdResponse(task_id=box.task_id, task_result=box.result)
        )

    async def SandboxWaitV2(self, stream: Stream) -> None:
        request = await self._request(stream)
        box = self.world.get(request.sandbox_id)
        if box.result is None and request.timeout > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(box.ended.wait(), request.timeout)
        await stream.send_message(
            api_pb2.SandboxWaitResponse(
                result=box.result,
                metadata=api_pb2.SandboxHandleMetadata(app_id=box.app_id, result=box.result),
            )
        )

    async def SandboxTerminateV2(self, stream: Stream) -> None:
        request = await self._request(stream)
        box = self.world.get(request.sandbox_id)
        self.world.finish(box, api_pb2.GenericResult.GENERIC_STATUS_TERMINATED, 0)
        await stream.send_message(api_pb2.SandboxTerminateResponse())

    async def SandboxGetFromNameV2(self, stream: Stream) -> None:
        request = await self._request(stream)
        app_id = self.world.apps.get((request.environment_name or "main", request.app_name))
        box = self.world.running_named(app_id or "", request.sandbox_name)
        if box is None and request.include_terminated:
            ended = [
                b
                for b in self.world.boxes.values()
                if b.app_id == app_id and b.name == request.sandbox_name
            ]
            box = max(ended, key=lambda b: b.created_at, default=None)
        if box is None:
            raise GRPCError(
                Status.NOT_FOUND, f"Sandbox with name '{request.sandbox_name}' not found"
            )
        await stream.send_message(
            api_pb2.SandboxGetFromNameResponse(
                sandbox_id=box.id, metadata=api_pb2.SandboxHandleMetadata(app_id=box.app_id)
            )
        )

    async def SandboxTagsGetV2(self, stream: Stream) -> None:
        request = await self._request(stream)
        box = self.world.get(request.sandbox_id)
        await stream.send_message(
            api_pb2.SandboxTagsGetResponse(
                tags=[api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in box.tags.items()]
            )
        )

    async def SandboxTagsSetV2(self, stream: Stream) -> None:
        request = await self._request(stream)
        box = self.world.get(request.sandbox_id)
        box.tags = {t.tag_name: t.tag_value for t in request.tags}
        await stream.send_message(Empty())

    async def SandboxListV2(self, stream: Stream) -> None:
        request: api_pb2.SandboxListRequest = await self._request(stream)
        wanted = {t.tag_name: t.tag_value for t in request.tags}
        found = sorted(
            (
                b
                for b in self.world.boxes.values()
                if (not request.app_id or b.app_id == request.app_id)
                and (request.include_finished or b.result is None)
                and (not request.before_timestamp or b.created_at < request.before_timestamp)
                and all(b.tags.get(k) == v for k, v in wanted.items())
            ),
            key=lambda b: b.created_at,
            reverse=True,
        )[: self.world.page_size]
        await stream.send_message(
            api_pb2.SandboxListResponse(
                sandboxes=[
                    api_pb2.SandboxInfo(
                        id=b.id,
                        created_at=b.created_at,
                        app_id=b.app_id,
                        task_info=api_pb2.TaskInfo(id=b.task_id, result=_result(b)),
                        metadata=api_pb2.SandboxHandleMetadata(app_id=b.app_id),
                    )
                    for b in found
                ]
            )
        )
