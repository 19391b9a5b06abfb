"""The E2B SDK, per worker process: a bound client with SDK-side retries off, and the
create call made through the SDK's own API client so the answer's headers survive.

`Sandbox.create` turns a 429 into a RateLimitException without its Retry-After, and
chokes on a 429 whose body is not JSON; the start path needs both, so create goes
through `get_api_client` (same auth, transport and base URL) and reads the answer here.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from e2b import ALL_TRAFFIC, E2B, Sandbox
from e2b.api.client.models import NewSandboxV2, SandboxNetworkConfig
from e2b.api.client.types import UNSET
from e2b.api.client_sync import get_api_client
from e2b.connection_config import ConnectionConfig

from tasks.sandbox.providers.e2b.errors import body_fields, from_status, retry_after

CREATE_ROUTE = "/v2/sandboxes"
# Handles (envd token included) kept per process so a poll costs one command, not two calls.
MAX_HANDLES = 256


@dataclass(frozen=True)
class Created:
    sandbox_id: str


@dataclass(frozen=True)
class Refused:
    status: int
    message: str
    error_code: str
    retry_after_s: float | None


class Session:
    """One process's SDK state; rebuilt after a fork (the pools must not be shared)."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.pid = os.getpid()
        self.params: dict[str, Any] = dict(params)
        self.client = E2B(**self.params)
        self.handles: OrderedDict[str, Sandbox] = OrderedDict()

    def create(
        self,
        *,
        template: str,
        metadata: Mapping[str, str],
        timeout_s: int | None,
        egress: tuple[str, ...] | None,
        key: str,
    ) -> Created | Refused:
        network: Any = UNSET
        if egress is not None:
            # allow_out wins over deny_out: everything is closed but the listed hosts.
            network = SandboxNetworkConfig(allow_out=list(egress), deny_out=[ALL_TRAFFIC])
        body = NewSandboxV2(
            template_id=template,
            metadata=dict(metadata),
            timeout=timeout_s if timeout_s is not None else UNSET,
            env_vars={},
            network=network,
        )
        headers = {"Idempotency-Key": key} if key else {}
        config = ConnectionConfig(**self.params)
        api = get_api_client(config)
        # pyqwest's httpx adapter waits read + write timeouts in all: the whole create
        # gets request_timeout, not twice it.
        deadline = httpx.Timeout(config.request_timeout, write=0.0)
        answer: httpx.Response = api.get_httpx_client().post(
            CREATE_ROUTE, json=body.to_dict(), headers=headers, timeout=deadline
        )
        if answer.status_code == 201:
            doc = answer.json()
            sandbox_id = doc.get("sandboxID") if isinstance(doc, dict) else None
            if isinstance(sandbox_id, str) and sandbox_id:
                return Created(sandbox_id)
        message, code = body_fields(answer.content)
        return Refused(answer.status_code, message, code, retry_after(answer.headers))

    def handle(self, sandbox_id: str) -> Sandbox:
        found = self.handles.get(sandbox_id)
        if found is None:
            # timeout=1 never lengthens a running sandbox: its lifetime stays the one set
            # at create.
            found = self.client.Sandbox.connect(sandbox_id, timeout=1)
            self.handles[sandbox_id] = found
            while len(self.handles) > MAX_HANDLES:
                self.handles.popitem(last=False)
        else:
            self.handles.move_to_end(sandbox_id)
        return found

    def forget(self, sandbox_id: str) -> None:
        self.handles.pop(sandbox_id, None)


def refused_error(refused: Refused) -> Exception:
    return from_status(
        refused.status,
        refused.message,
        error_code=refused.error_code,
        retry_after_s=refused.retry_after_s,
    )
