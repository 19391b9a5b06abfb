"""The fair order's state in Redis: one Lua script per operation (lua/), each atomic.

Keys share the hash tag `{fleet}` (tasks.constants.KEY_FAIR), so the scripts run on
Redis Cluster too. Only NOSCRIPT re-sends a call (nothing ran); a timeout may have run
the script and propagates, as in the start-rate bucket.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.exceptions import NoScriptError

from tasks.acquisition.fairshare.order import Candidate
from tasks.acquisition.startrate.bucket import no_retry_client
from tasks.constants import KEY_FAIR
from tasks.errors import StartRateReplyError

# How long a published start counts as in flight without news of it (a worker that died
# holding it, a publish lost, a worker slow to take it): the relay also counts the queue's
# length, so forgetting it early cannot let the queue grow past the window.
INFLIGHT_MS = 5_000
KEY_TTL_MS = 86_400_000  # a day without starts: the order starts afresh
BACKLOG_FIELD = "~b"  # in the tags hash: 0 once a pass left nothing unsent


@dataclass(frozen=True)
class Script:
    body: str
    sha: str


@cache
def script(name: str) -> Script:
    body = resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")
    return Script(body, hashlib.sha1(body.encode("utf-8")).hexdigest())


@dataclass(frozen=True)
class Keys:
    tags: str
    inflight: str
    owners: str
    counts: str
    lease: str
    again: str

    @classmethod
    def under(cls, prefix: str) -> Keys:
        return cls(*(prefix + name for name in
                     ("tags", "inflight", "owners", "counts", "lease", "again")))


@dataclass(frozen=True)
class Taken:
    counted: bool
    inflight: int
    window: int
    backlog: bool = True  # the last pass left starts unsent (or none said otherwise)


class FairStore:
    """pick / sent / taken and the relay's lease, against one Redis."""

    def __init__(self, client: redis.Redis, *, prefix: str = KEY_FAIR,
                 socket_timeout_s: float = 2.0) -> None:
        self.client = no_retry_client(client, socket_timeout_s)
        self.keys = Keys.under(prefix)

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        s = script(name)
        try:
            return self.client.evalsha(s.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.client.script_load(s.body)
            return self.client.evalsha(s.sha, len(keys), *keys, *args)

    def pick(self, window: int, queued: int, candidates: Sequence[Candidate], *,
             now_ms: int | None = None, clear_only: bool = False) -> list[str]:
        """`clear_only`: nothing unless the last pass left no start unsent."""
        k = self.keys
        args: list[Any] = [window, queued, "" if now_ms is None else now_ms, KEY_TTL_MS,
                           "1" if clear_only else ""]
        for c in candidates:
            args += [c.org, c.weight, c.due, c.room]
        reply = self._run("pick", (k.tags, k.inflight, k.owners, k.counts), args)
        if not isinstance(reply, list) or len(reply) > max(window, 0):
            raise StartRateReplyError(f"fair pick answered {reply!r:.200}")
        return [v.decode() if isinstance(v, bytes) else str(v) for v in reply]

    def sent(self, messages: Sequence[tuple[str, str]], *, count_ms: int = INFLIGHT_MS,
             now_ms: int | None = None) -> int:
        k = self.keys
        args: list[Any] = [count_ms, "" if now_ms is None else now_ms, KEY_TTL_MS]
        for task_id, org in messages:
            args += [task_id, org]
        return int(self._run("sent", (k.inflight, k.owners, k.counts), args))

    def taken(self, task_id: str) -> Taken:
        k = self.keys
        reply = self._run("taken", (k.inflight, k.owners, k.counts, k.tags), [task_id])
        try:
            was, inflight, window, backlog = (int(v) for v in reply)
        except (TypeError, ValueError) as exc:
            raise StartRateReplyError(f"fair taken answered {reply!r:.200}") from exc
        return Taken(bool(was), inflight, window, bool(backlog))

    def backlog_noted(self) -> bool:
        """False only once a pass noted that it left nothing unsent."""
        value: Any = self.client.hget(self.keys.tags, BACKLOG_FIELD)
        return value not in (b"0", "0")

    def note_backlog(self, left: bool) -> None:
        """What the last relay pass left unsent, for `taken` (a field of the tags hash)."""
        self.client.hset(self.keys.tags, BACKLOG_FIELD, "1" if left else "0")

    def lock(self, token: str, ttl_ms: int) -> bool:
        return bool(self.client.set(self.keys.lease, token, nx=True, px=ttl_ms))

    def unlock(self, token: str) -> bool:
        return bool(self._run("unlock", (self.keys.lease,), [token]))

    def ask_again(self, ttl_ms: int) -> None:
        self.client.set(self.keys.again, b"1", px=ttl_ms)

    def asked_again(self) -> bool:
        """True once per request: reading it clears it."""
        return bool(self.client.getdel(self.keys.again))

    def inflight(self) -> int:
        n = self.client.zcard(self.keys.inflight)
        assert isinstance(n, int)  # a synchronous client
        return n
