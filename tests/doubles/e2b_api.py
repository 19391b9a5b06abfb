"""The E2B control plane in the double: create (idempotent), connect, list, kill.

Pushback is E2B's own: the per-team limiter answers 429 "Rate limit exceeded" with
Retry-After and RateLimit-* headers; the concurrency cap answers 429 "you have reached
the maximum number of concurrent E2B sandboxes (N)"; a bad key answers 401.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from typing import Any
from urllib.parse import parse_qs, parse_qsl, unquote

from tests.doubles.e2b_envd import Envd, Receive, Scope, Send, _headers, read_body, reply
from tests.doubles.e2b_state import Pushback, World

DEFAULT_TIMEOUT_S = 300
ENVD_HEADER = b"e2b-sandbox-id"


def concurrency_message(limit: int) -> str:
    return (
        f"you have reached the maximum number of concurrent E2B sandboxes ({limit}). "
        "If you need more, please contact us at 'https://e2b.dev/docs/getting-help'"
    )


class ControlPlane:
    def __init__(self, world: World, envd: Envd) -> None:
        self.world = world
        self.envd = envd

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["type"] != "http":
            return
        # One listener serves both: E2B_SANDBOX_URL points the SDK's envd calls here.
        if any(k == ENVD_HEADER for k, _ in scope.get("headers", [])):
            return await self.envd(scope, receive, send)
        headers = _headers(scope)
        if headers.get("x-api-key") != self.world.api_key:
            return await reply(send, 401, {"code": 401, "message": "Invalid API key"})
        self.world.expire()
        method, parts = scope["method"], scope["path"].strip("/").split("/")
        if (method, parts) == ("POST", ["v2", "sandboxes"]):
            return await self.create(headers, await read_body(receive), send)
        if (method, parts) == ("GET", ["v2", "sandboxes"]):
            return await self.list(scope, send)
        if (
            method == "POST"
            and len(parts) == 4
            and parts[:2] == ["v2", "sandboxes"]
            and parts[3] == "connect"
        ):
            box = self.world.box(parts[2])
            if box is None:
                return await reply(send, 404, _not_found(parts[2]))
            return await reply(send, 200, box.answer())
        if method == "DELETE" and len(parts) == 2 and parts[0] == "sandboxes":
            if not self.world.remove(parts[1]):
                return await reply(send, 404, _not_found(parts[1]))
            return await reply(send, 204, None)
        return await reply(send, 404, {"code": 404, "message": "no such route"})

    async def create(self, headers: dict[str, str], body: bytes, send: Send) -> None:
        world = self.world
        refused = self._pushback()
        if refused is not None:
            status, doc, extra = refused
            return await reply(send, status, doc, headers=extra)
        doc = json.loads(body)
        key = headers.get("idempotency-key")
        digest = hashlib.sha256(body).hexdigest()
        if key:
            with world.lock:
                seen = world.keys.get(key)
            if seen is not None:
                if seen[0] != digest:
                    return await reply(
                        send,
                        409,
                        {
                            "code": 409,
                            "error_code": "idempotency_request_mismatch",
                            "message": "the idempotency key was used with another request",
                        },
                    )
                box = world.box(seen[1])
                if box is not None:  # a replay answers what the first create answered
                    return await reply(send, 201, box.answer())
        if world.create_latency_s:
            await _pause(world, world.create_latency_s)
        box = world.new_box(
            doc.get("templateID", "base"),
            dict(doc.get("metadata") or {}),
            dict(doc.get("envVars") or {}),
            doc.get("network"),
            float(doc.get("timeout") or DEFAULT_TIMEOUT_S),
        )
        if key:
            with world.lock:
                world.keys[key] = (digest, box.sandbox_id)
        with world.lock:
            lose = world.lost_answers > 0
            world.lost_answers -= 1 if lose else 0
        if lose:  # made, but the answer comes after the client gave up
            await _pause(world, world.lost_answer_delay_s)
        return await reply(send, 201, box.answer())

    def _pushback(self) -> tuple[int, dict[str, Any], dict[str, str]] | None:
        world = self.world
        now = time.time()
        with world.lock:
            forced = world.pushbacks.popleft() if world.pushbacks else None
            live = len(world.boxes)
            window = world.create_times
            while window and window[0] <= now - 60:
                window.popleft()
            if (
                forced is None
                and world.creates_per_min is not None
                and len(window) >= world.creates_per_min
            ):
                wait = max(1, math.ceil(window[0] + 60 - now))
                forced = Pushback("rate_limited", float(wait))
            if forced is None and world.max_live is not None and live >= world.max_live:
                forced = Pushback("capacity_unavailable", None)
            if forced is None:
                window.append(now)
                return None
            if forced.kind != "auth":
                world.n_rejected_429 += 1
        extra = {}
        if forced.retry_after_s is not None:
            extra["Retry-After"] = str(math.ceil(forced.retry_after_s))
        if forced.kind == "auth":
            return 401, {"code": 401, "message": "Invalid API key"}, extra
        if forced.kind == "capacity_unavailable":
            limit = world.max_live if world.max_live is not None else 20
            return 429, {"code": 429, "message": concurrency_message(limit)}, extra
        limit = math.ceil(world.creates_per_min or 60)
        extra.update(
            {
                "RateLimit-Limit": str(limit),
                "RateLimit-Remaining": "0",
                "RateLimit-Reset": extra.get("Retry-After", "1"),
            }
        )
        return 429, {"code": 429, "message": "Rate limit exceeded"}, extra

    async def list(self, scope: Scope, send: Send) -> None:
        query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        # The SDK quotes each key and value, then url-encodes the pairs: undo both.
        wanted = {unquote(k): unquote(v) for k, v in parse_qsl(query.get("metadata", ""))}
        states = set(query["state"].split(",")) if "state" in query else {"running", "paused"}
        with self.world.lock:
            boxes = sorted(self.world.boxes.values(), key=lambda b: (b.started_at, b.sandbox_id))
        found = [
            b
            for b in boxes
            if "running" in states and all(b.metadata.get(k) == v for k, v in wanted.items())
        ]
        start = int(query.get("nextToken") or 0)
        limit = int(query.get("limit") or 100)
        page = found[start : start + limit]
        extra = {"x-next-token": str(start + limit)} if start + limit < len(found) else {}
        return await reply(send, 200, [b.listed() for b in page], headers=extra)


async def _pause(world: World, seconds: float) -> None:
    """Sleeps, but not past the double's shutdown (a late answer must not hold it up)."""
    deadline = time.monotonic() + seconds
    while not world.closing and time.monotonic() < deadline:
        await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def _not_found(sandbox_id: str) -> dict[str, Any]:
    return {
        "code": 404,
        "message": f"sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it",
    }


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
