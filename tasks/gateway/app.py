"""The runtime API that sandboxes call back to: `POST /v1/runtime`, `GET /healthz`.

A request carries a capability token and one action or a batch of them. Everything is
checked before anything runs: body size, token, JSON (through the untrusted reader),
each action's name, fields and capability. Refusals are JSON `{"code", "error"}`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tasks.constants import RELEASE_BATCH_WINDOW_S
from tasks.errors import (
    CapabilityDeniedError,
    DocumentInvalidError,
    FenceLostError,
    GatewayBadRequestError,
    GatewayBodyTooLargeError,
    GatewayError,
    GatewayRateLimitedError,
    GatewayUnknownActionError,
    GatewayUnknownFieldError,
    PlayrunError,
    SheetWriteIntentInvalidError,
    SheetWriteVersionMismatchError,
)
from tasks.gateway import guard, observe
from tasks.gateway.actions import ACTIONS, Action, ActionRequest, Context
from tasks.gateway.beats import BeatBatcher
from tasks.gateway.budgets import retry_after_header
from tasks.gateway.fleet.limits import Hold, limits_for
from tasks.gateway.lost import LostLaunches
from tasks.gateway.lost import refusal as lost_refusal
from tasks.gateway.refusals import Refusals
from tasks.gateway.releases import ReleaseBatcher, Send
from tasks.gateway.wakeups import Wakeups
from tasks.parse import untrusted
from tasks.security import tokens
from tasks.settings import Settings
from tasks.store.db import session_scope

log = logging.getLogger("playrun.gateway")

MAX_BATCH = 50
# The runner names the action it sends: its body is bounded by that action's limit before
# a byte is read. Without it the bound is the largest of the token's actions.
ACTION_HEADER = "x-playrun-action"
# Bodies up to this size are parsed on the event loop (a thread hop costs more than them).
PARSE_ON_LOOP_BYTES = 64 * 1024
# Status codes for the errors of the one tree that are not gateway errors.
_STATUS: dict[type[PlayrunError], int] = {
    FenceLostError: 409, SheetWriteIntentInvalidError: 409, SheetWriteVersionMismatchError: 409,
}


# A lost fence says nothing of the run: a replayed token learns neither status nor code.
FENCE_LOST_MESSAGE = "this token's attempt is not current"


def refusal(exc: PlayrunError) -> JSONResponse:
    status = exc.status if isinstance(exc, GatewayError) else _STATUS.get(type(exc), 400)
    message = FENCE_LOST_MESSAGE if isinstance(exc, FenceLostError) else exc.message
    if isinstance(exc, GatewayRateLimitedError):
        return JSONResponse({"code": exc.code, "error": message,
                             # Whole milliseconds, never 0: a refused request always waits.
                             "retry_after_s": max(math.ceil(exc.retry_after_s * 1000), 1)
                             / 1000}, status_code=status,
                            headers={"Retry-After": retry_after_header(exc.retry_after_s)})
    return JSONResponse({"code": exc.code, "error": message}, status_code=status)


def declared_size(request: Request, limit: int) -> int:
    """The body's size as its header declares it (the limit when it declares none), or 413:
    a body too large is refused before it costs the attempt's budget anything."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise GatewayBodyTooLargeError(f"the body is larger than {limit} bytes")
    return limit if declared is None else int(declared)


def unread_is_large(request: Request) -> bool:
    """Whether the body left unread may be large: declared so, or of no declared length."""
    declared = request.headers.get("content-length")
    if declared is None:
        return "chunked" in request.headers.get("transfer-encoding", "").lower()
    return not declared.isdigit() or int(declared) > PARSE_ON_LOOP_BYTES


async def read_body(request: Request, limit: int) -> bytes:
    declared_size(request, limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise GatewayBodyTooLargeError(f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_body(body: bytes, limit: int, max_values: int) -> Any:
    """A large body is decoded in the thread pool: the loop keeps answering other beats."""
    if len(body) <= PARSE_ON_LOOP_BYTES:
        return untrusted.parse(body, max_bytes=limit, max_values=max_values)
    return await run_in_threadpool(untrusted.parse, body, max_bytes=limit,
                                   max_values=max_values)


def body_limit(request: Request, grant: tokens.Grant,
               settings: Settings) -> tuple[int, str | None]:
    """(bytes the body may have, the action the header names if any)."""
    hinted = request.headers.get(ACTION_HEADER)
    if hinted is not None:
        action = ACTIONS.get(hinted)
        if action is None:
            raise GatewayUnknownActionError(f"unknown action {hinted[:100]!r}")
        return min(action.max_bytes, settings.gateway_max_body_bytes), hinted
    allowed = [a.max_bytes for a in ACTIONS.values() if a.capability in grant.capabilities]
    return min(max(allowed, default=0), settings.gateway_max_body_bytes), None


def check_sizes(actions: list[Action], size: int, hinted: str | None) -> None:
    """What the body's actions turned out to be bounds it too, before they are validated."""
    if hinted is not None and any(a.name != hinted for a in actions):
        raise GatewayBadRequestError(f"the body holds actions other than {hinted[:100]!r}")
    limit = max(a.max_bytes for a in actions)
    if size > limit:
        raise GatewayBodyTooLargeError(f"the body is larger than {limit} bytes")


def bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _validate(action: Action, item: dict[str, Any]) -> ActionRequest:
    try:
        return action.model.model_validate(item)
    except ValidationError as exc:
        errors = exc.errors()
        extra = [".".join(str(p) for p in e["loc"]) for e in errors
                 if e["type"] == "extra_forbidden"]
        if extra:
            raise GatewayUnknownFieldError(
                f"{action.name}: unknown field(s) {', '.join(extra)[:300]}") from None
        first = errors[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise GatewayBadRequestError(
            f"{action.name}: {where}: {first['msg']}"[:500]) from None


def plan(doc: Any, grant: tokens.Grant, size: int = 0,
         hinted: str | None = None) -> list[tuple[Action, Any]]:
    """Every action of the request, resolved and allowed, or the first refusal."""
    if not isinstance(doc, dict):
        raise GatewayBadRequestError("the body must be a JSON object")
    if "actions" in doc:
        if set(doc) != {"actions"}:
            raise GatewayUnknownFieldError("a batch carries only `actions`")
        items = doc["actions"]
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
            raise GatewayBadRequestError(f"`actions` must list 1 to {MAX_BATCH} actions")
    else:
        items = [doc]
    resolved = []
    for item in items:
        name = item.get("action") if isinstance(item, dict) else None
        if not isinstance(name, str):
            raise GatewayBadRequestError("each action needs an `action` name")
        action = ACTIONS.get(name)
        if action is None:
            raise GatewayUnknownActionError(f"unknown action {name[:100]!r}")
        if action.capability not in grant.capabilities:
            raise CapabilityDeniedError(f"{name} needs the {action.capability} capability")
        resolved.append((action, item))
    check_sizes([a for a, _ in resolved], size, hinted)
    return [(action, _validate(action, item)) for action, item in resolved]


async def run_action(action: Action, grant: tokens.Grant, model: ActionRequest,
                     ctx: Context) -> Any:
    """Blocking handlers run in the thread pool; coroutine handlers on the loop."""
    if asyncio.iscoroutinefunction(action.handler):
        return await action.handler(grant, model, ctx)
    return await run_in_threadpool(action.handler, grant, model, ctx)


def create_app(settings: Settings, send_task: Send) -> Starlette:
    beats = BeatBatcher(settings.heartbeat_timeout_s, settings.gateway_beat_window_s)
    releases = ReleaseBatcher(send_task, RELEASE_BATCH_WINDOW_S)
    # Budgets and the refusal count in Redis for the whole fleet (in memory without it);
    # the refusals' ledger rows are this process's own.
    limits = limits_for(settings)
    ctx = Context(settings=settings, beats=beats, releases=releases,
                  wakeups=Wakeups(settings.redis_url),
                  refusals=Refusals(settings.gateway_abuse_refusals,
                                    settings.gateway_abuse_window_s,
                                    shared=limits if limits.store is not None else None))
    lost = LostLaunches()

    async def runtime(request: Request) -> JSONResponse:
        started = time.perf_counter()
        label, code = observe.UNKNOWN, observe.OK
        admitted: Hold | None = None
        grant: tokens.Grant | None = None
        acting = False  # refusals before an action runs are the gateway's own: counted
        read = False
        try:
            grant = tokens.verify(bearer(request), settings.secret_key)
            held = lost.hold_s(grant)
            if held is not None:
                await asyncio.sleep(held)
                raise lost_refusal(grant)
            ctx.refusals.check((grant.run_id, grant.generation))
            limit, hinted = body_limit(request, grant, settings)
            admitted = await limits.admit((grant.run_id, grant.generation),
                                          declared_size(request, limit))
            body = await read_body(request, limit)
            read = True
            try:
                doc = await parse_body(body, limit, settings.gateway_max_body_values)
            except DocumentInvalidError as exc:
                raise GatewayBadRequestError(f"the body is not usable: {exc.message}") from None
            planned = plan(doc, grant, len(body), hinted)
            label = observe.request_label([a.name for a, _ in planned], "actions" in doc)
            results = []
            acting = True
            for action, model in planned:
                results.append(await run_action(action, grant, model, ctx))
                observe.effects(action.name, results[-1])
        except PlayrunError as exc:
            if grant is not None and not acting and isinstance(exc, GatewayError):
                exc = await guard.refused(grant, exc, ctx)
            elif grant is not None and acting and isinstance(exc, FenceLostError):
                lost.lost(grant)
            code = exc.code
            response = refusal(exc)
            if not read and unread_is_large(request):
                # Closing costs the client a reconnect; draining would cost this process
                # the whole body it refused (a flood of 4 MiB bodies is mostly that).
                response.headers["connection"] = "close"
            return response
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            log.warning("database unavailable: %s", exc)
            code = "GATEWAY_UNAVAILABLE"
            return JSONResponse({"code": code, "error": "the database is unavailable; retry"},
                                status_code=503)
        except Exception:
            log.exception("gateway action failed")
            code = "GATEWAY_INTERNAL"
            return JSONResponse({"code": code, "error": "internal error"}, status_code=500)
        finally:
            if admitted is not None:
                limits.release(admitted)
            observe.request(label, code, time.perf_counter() - started)
        if "actions" in doc:
            return JSONResponse({"ok": True, "results": results})
        return JSONResponse({"ok": True, "result": results[0]})

    async def healthz(_request: Request) -> JSONResponse:
        def ping() -> None:
            with session_scope(readonly=True) as session:
                session.execute(sa.text("SELECT 1"))
        try:
            await run_in_threadpool(ping)
        except sa.exc.SQLAlchemyError:
            return JSONResponse({"ok": False, "database": "unavailable"}, status_code=503)
        return JSONResponse({"ok": True})

    asgi = Starlette(routes=[
        Route("/v1/runtime", runtime, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ])
    asgi.state.releases = releases  # serve.py sends what is queued as it stops
    asgi.state.limits = limits
    return asgi
