"""The fair order's maths in Python: what lua/pick.lua, sent.lua and taken.lua do.

Start-time fair queueing by org (an equivalent of deficit round robin with a quantum of
one start): each org has the start tag of its next start; the next start goes to the org
with runs due whose tag is least; serving it moves its tag on by SCALE // weight. An org
that comes back after idling (or after its capacity limit held it back) starts at the
fleet's virtual time, the tag of the last start picked, so it banks no credit. The
differential test (tests/integration/test_fairshare_lua.py) runs both on the same operations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

SCALE = 7207200  # divisible by 1..16: small weights share exactly


@dataclass(frozen=True)
class Candidate:
    org: str
    weight: int
    due: int  # runs due now, at most the window
    room: int  # capacity room, -1 when no limit applies


@dataclass
class State:
    """The Redis keys' contents: H, G, O and C of pick.lua."""

    tags: dict[str, int] = field(default_factory=dict)
    virtual: int = 0
    window: int | None = None
    backlog: bool = True  # what the last relay pass noted ('~b' of H)
    inflight: dict[str, tuple[int, str]] = field(default_factory=dict)  # id -> (until, org)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, org in self.inflight.values():
            out[org] = out.get(org, 0) + 1
        return out


def expire(state: State, now_ms: int) -> None:
    for task_id, (until, _) in list(state.inflight.items()):
        if until <= now_ms:
            del state.inflight[task_id]


def pick(state: State, window: int, queued: int, now_ms: int,
         candidates: Sequence[Candidate], *, clear_only: bool = False) -> list[str]:
    expire(state, now_ms)
    if clear_only and state.backlog:
        return []
    state.window = window
    room = window - max(len(state.inflight), queued)
    if room <= 0:
        return []
    counts = state.counts()
    tags, costs, left = [], [], []
    for c in candidates:
        tags.append(max(state.tags.get(c.org, 0), state.virtual))
        costs.append(SCALE // c.weight)
        due = c.due
        if c.room >= 0:
            due = min(due, c.room - counts.get(c.org, 0))
        left.append(due)
    picked: list[str] = []
    served: set[int] = set()
    while len(picked) < room:
        best: int | None = None
        for i in range(len(candidates)):
            if left[i] > 0 and (best is None or tags[i] < tags[best]):
                best = i  # ties: the earlier candidate
        if best is None:
            break
        picked.append(candidates[best].org)
        state.virtual = tags[best]
        tags[best] += costs[best]
        left[best] -= 1
        served.add(best)
    for i in served:
        state.tags[candidates[i].org] = tags[i]
    return picked


def sent(state: State, count_ms: int, now_ms: int, messages: Sequence[tuple[str, str]]) -> int:
    for task_id, org in messages:
        if task_id in state.inflight:
            state.inflight[task_id] = (now_ms + count_ms, state.inflight[task_id][1])
        else:
            state.inflight[task_id] = (now_ms + count_ms, org)
    return len(state.inflight)


def taken(state: State, task_id: str) -> tuple[bool, int, int, bool]:
    was = state.inflight.pop(task_id, None) is not None
    return was, len(state.inflight), state.window or 0, state.backlog


def note_backlog(state: State, left: bool) -> None:
    state.backlog = left
