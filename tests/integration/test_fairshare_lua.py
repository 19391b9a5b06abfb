"""The fair order in Redis against its Python maths: same operations, same replies, same
stored state (hypothesis drives the interleavings of picks, publishes and permits)."""

from __future__ import annotations

import uuid
from collections import Counter

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.acquisition.fairshare import order
from tasks.acquisition.fairshare.order import Candidate
from tasks.acquisition.fairshare.store import FairStore, Taken
from tests.support.session import TEST_REDIS_URL

T0 = 1_796_000_000_000
ORGS = ["a", "b", "c", "d", "~v"]  # "~v" is a legal org name: it must not clash


def store() -> FairStore:
    return FairStore(redis.Redis.from_url(TEST_REDIS_URL),
                     prefix=f"playrun:fair:{{t-{uuid.uuid4().hex[:10]}}}:")


def stored(s: FairStore) -> tuple[dict[str, int], int, dict[str, tuple[int, str]]]:
    c = s.client
    raw = {k.decode(): int(v) for k, v in c.hgetall(s.keys.tags).items()}
    tags = {k[2:]: v for k, v in raw.items() if k.startswith("o:")}
    owners = {k.decode(): v.decode() for k, v in c.hgetall(s.keys.owners).items()}
    inflight = {m.decode(): (int(score), owners[m.decode()])
                for m, score in c.zrange(s.keys.inflight, 0, -1, withscores=True)}
    counts = {k.decode(): int(v) for k, v in c.hgetall(s.keys.counts).items()}
    assert counts == dict(Counter(org for _, org in inflight.values()))
    return tags, raw.get("~v", 0), inflight


candidate = st.builds(Candidate, st.sampled_from(ORGS), st.integers(1, 1000),
                      st.integers(0, 12), st.integers(-1, 6))
op = st.one_of(
    st.tuples(st.just("pick"), st.integers(0, 16), st.integers(0, 20),
              st.lists(candidate, max_size=5, unique_by=lambda c: c.org), st.booleans()),
    st.tuples(st.just("sent"), st.integers(1, 60_000),
              st.lists(st.tuples(st.integers(0, 30).map(str), st.sampled_from(ORGS)),
                       max_size=6, unique_by=lambda m: m[0])),
    st.tuples(st.just("taken"), st.integers(0, 30).map(str)),
    st.tuples(st.just("backlog"), st.booleans()),
    st.tuples(st.just("wait"), st.integers(0, 40_000)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, max_size=30))
def test_lua_and_python_agree_on_every_interleaving(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    s, model, now = store(), order.State(), T0
    try:
        for step in ops:
            if step[0] == "pick":
                _, window, queued, cands, clear_only = step
                cands = sorted(cands, key=lambda c: c.org)
                assert s.pick(window, queued, cands, now_ms=now, clear_only=clear_only) == \
                    order.pick(model, window, queued, now, cands, clear_only=clear_only)
            elif step[0] == "sent":
                _, count_ms, messages = step
                assert s.sent(messages, count_ms=count_ms, now_ms=now) == \
                    order.sent(model, count_ms, now, messages)
            elif step[0] == "taken":
                got = s.taken(step[1])
                assert (got.counted, got.inflight, got.window, got.backlog) == \
                    order.taken(model, step[1])
            elif step[0] == "backlog":
                s.note_backlog(step[1])
                order.note_backlog(model, step[1])
            else:
                now += step[1]
            tags, virtual, inflight = stored(s)
            assert (tags, virtual) == (model.tags, model.virtual)
            assert inflight == model.inflight
    finally:
        s.client.delete(*vars(s.keys).values())


def test_weights_share_the_starts_and_a_returning_org_banks_no_credit() -> None:
    s = store()
    try:
        picks = s.pick(600, 0, [Candidate("a", 1, 600, -1), Candidate("b", 2, 600, -1),
                                Candidate("c", 3, 600, -1)], now_ms=T0)
        assert Counter(picks) == {"a": 100, "b": 200, "c": 300}
        # "d" was idle through all of that: it gets the next start, not 600 of them.
        s.client.delete(s.keys.inflight, s.keys.owners, s.keys.counts)
        picks = s.pick(6, 0, [Candidate("a", 1, 9, -1), Candidate("d", 1, 9, -1)], now_ms=T0)
        assert picks[0] == "d" and Counter(picks) == {"a": 3, "d": 3}
    finally:
        s.client.delete(*vars(s.keys).values())


def test_an_org_at_its_capacity_yields_its_turns_and_the_window_bounds_the_picks() -> None:
    s = store()
    try:
        picks = s.pick(8, 0, [Candidate("big", 1, 8, 0), Candidate("small", 1, 8, 2)],
                       now_ms=T0)
        assert picks == ["small", "small"]  # "big" has no room; "small" only two slots
        s.sent([("m1", "small"), ("m2", "small")], now_ms=T0)
        # Both of small's slots are in flight: nothing more for it, and the window counts them.
        assert s.pick(3, 0, [Candidate("small", 1, 8, 2)], now_ms=T0) == []
        assert s.pick(3, 0, [Candidate("x", 1, 8, -1)], now_ms=T0) == ["x"]
        assert s.taken("m1") == Taken(True, 1, 3)  # m2 still in flight; window 3
        assert s.taken("m1") == Taken(False, 1, 3)  # a second report changes nothing
        one = [Candidate("y", 1, 1, -1)]
        assert s.pick(3, 0, one, now_ms=T0, clear_only=True) == []  # nothing noted yet
        s.note_backlog(False)  # the last pass left nothing unsent: `taken` need not pump
        assert s.taken("m2") == Taken(True, 0, 3, backlog=False)
        assert s.pick(3, 0, one, now_ms=T0, clear_only=True) == ["y"]  # may skip the queue
        s.note_backlog(True)
        assert s.pick(3, 0, one, now_ms=T0, clear_only=True) == []  # starts wait: their turn
        assert s.pick(2, 5, [Candidate("x", 1, 8, -1)], now_ms=T0) == []  # queue is full
    finally:
        s.client.delete(*vars(s.keys).values())
