"""Fair order of starts by org, end to end: real workers (beat included), PostgreSQL and
Redis, the `fake` provider with hosted runners (no runner host: a started run just holds
its sandbox, so only the order of starts matters here)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
import sqlalchemy as sa

import tasks
from models import Attempt, Outbox, Run, RunEvent
from tasks.acquisition import capacity, policy
from tasks.constants import QUEUE, EventKind
from tasks.sandbox import FakeScript
from tasks.settings import reset_settings
from tasks.store.db import session_scope
from tests.support.env import SANDBOX_ROOT
from tests.support.helpers import eventually
from tests.support.paths import ROOT
from tests.support.runs import close_open_runs
from tests.support.session import TEST_REDIS_URL
from tests.support.stack import Worker, worker_env

pytestmark = pytest.mark.slow
NOOP = str(ROOT / "examples" / "plays" / "noop.py")
PREFIX = "fair-"


def fast(per_min: int, **more: str) -> dict[str, str]:
    """A fixed start rate, room for every run, the fair order (the default)."""
    rate = str(per_min)
    return {"PLAYRUN_SANDBOX_PROVIDER": "fake", "PLAYRUN_START_RATE_INITIAL_PER_MIN": rate,
            "PLAYRUN_START_RATE_MAX_PER_MIN": rate, "PLAYRUN_START_RATE_FLOOR_PER_MIN": rate,
            "PLAYRUN_ORG_CAPACITY": "100000", "PLAYRUN_SWEEP_INTERVAL_S": "0.5",
            "PLAYRUN_HEARTBEAT_TIMEOUT_S": "600", "PLAYRUN_RUN_TIMEOUT_S": "600",
            "PLAYRUN_OUTBOX_RESEND_AFTER_S": "3", **more}


def org(name: str) -> str:
    return f"{PREFIX}{name}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(autouse=True)
def clean_slate(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def reset() -> None:
        close_open_runs(PREFIX)
        policy.set_policy(policy.NORMAL, for_s=None)
        client = redis.Redis.from_url(TEST_REDIS_URL)
        for pattern in ("playrun:startrate:*", "playrun:fair:*"):
            for key in client.scan_iter(match=pattern):
                client.delete(key)
        client.delete(QUEUE)
        FakeScript(SANDBOX_ROOT).reset()
        FakeScript(SANDBOX_ROOT).set(hosted_runners=True)
    reset()
    yield
    reset()
    monkeypatch.undo()
    reset_settings()


def fleet(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], n: int = 2,
          concurrency: int = 2) -> list[Worker]:
    """Workers with `env`; this process (which submits, and so relays) shares it."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    reset_settings()
    workers = [Worker(worker_env(**env), concurrency=concurrency, beat=i == 0)
               for i in range(n)]
    for w in workers:
        w.wait_ready()
    return workers


def starts(orgs: list[str]) -> list[tuple[str, str, float]]:
    """(org, run, when) of each start permit used, in the order they were written."""
    with session_scope(readonly=True) as session:
        rows = session.execute(
            sa.select(Run.org_id, Run.id, RunEvent.at).join(Run, Run.id == RunEvent.run_id)
            .where(RunEvent.kind == EventKind.SANDBOX_REQUESTED, Run.org_id.in_(orgs))
            .order_by(RunEvent.id)).all()
    return [(o, r, t.timestamp()) for o, r, t in rows]


def submit(org_id: str, n: int) -> list[str]:
    handles = tasks.submit_runs([{"play": NOOP, "org_id": org_id} for _ in range(n)])
    return [h.id for h in handles]


def test_a_small_org_behind_a_large_backlog_starts_within_a_few_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    workers = fleet(monkeypatch, fast(240))  # a start every 250 ms
    try:
        big, small = org("big"), org("small")
        submit(big, 80)
        eventually(lambda: len(starts([big])) >= 5, timeout=30)
        before = len(starts([big]))  # more than 5 may have started by now
        submit(small, 3)
        eventually(lambda: any(o == small for o, _, _ in starts([big, small])), timeout=30)
        order = [o for o, _, _ in starts([big, small])]
        first_small = order.index(small)
        # Under FIFO all 80 of big's would go first; fair: at most the window (the rate's
        # next second: 4) plus one, counted from the first start after the submit.
        ahead = sum(1 for o in order[before:first_small] if o == big)
        assert ahead <= 6, order[:first_small + 1]
        # And all of small's come before big is through its backlog.
        eventually(lambda: Counter(o for o, _, _ in starts([small]))[small] == 3, timeout=30)
        assert len(starts([big])) < 40
    finally:
        for w in workers:
            w.stop()


def test_weights_1_2_3_share_the_starts_in_proportion(monkeypatch: pytest.MonkeyPatch) -> None:
    workers = fleet(monkeypatch, fast(900), concurrency=3)  # a start every 67 ms
    try:
        orgs = [org(f"w{w}") for w in (1, 2, 3)]
        for w, o in zip((1, 2, 3), orgs, strict=True):
            capacity.set_limit(o, 100000, weight=w)
        # One batch: every org has runs waiting from the first pick on.
        tasks.submit_runs([{"play": NOOP, "org_id": o} for _ in range(120) for o in orgs])
        eventually(lambda: len(starts(orgs)) >= 200, timeout=120)
        # 180 starts while all three still wait (the weight-3 org has 120 runs: 90 go).
        counted = Counter(o for o, _, _ in starts(orgs)[10:190])
        for w, o in zip((1, 2, 3), orgs, strict=True):
            share = counted[o] / 180
            assert abs(share - w / 6) <= 0.1 * w / 6, (w, counted)
    finally:
        for wk in workers:
            wk.stop()


def test_an_org_at_its_capacity_limit_does_not_slow_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    workers = fleet(monkeypatch, fast(600, PLAYRUN_CAPACITY_FULL="defer"))
    try:
        full, other = org("full"), org("other")
        capacity.set_limit(full, 2)
        submit(full, 40)
        eventually(lambda: len(starts([full])) == 2, timeout=30)
        submit(other, 30)
        eventually(lambda: len(starts([other])) == 30, timeout=60)
        # The full org yielded its turns: its runs were not published to spin through
        # capacity deferrals while the other org started.
        with session_scope(readonly=True) as session:
            deferred = session.scalar(
                sa.select(sa.func.count()).select_from(RunEvent)
                .join(Run, Run.id == RunEvent.run_id)
                .where(Run.org_id == full, RunEvent.kind == EventKind.DEFERRED))
        assert len(starts([full])) == 2
        assert (deferred or 0) <= 3, deferred
    finally:
        for wk in workers:
            wk.stop()


def test_workers_killed_while_publishing_fairly_lose_nothing_and_start_nothing_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    env = fast(300, PLAYRUN_LEASE_SECONDS="4")
    keeper, *_ = fleet(monkeypatch, env, n=1)  # beat lives here: it is never killed
    victims: list[Worker] = []
    try:
        orgs = [org(f"k{i}") for i in range(3)]
        ids = [h.id for h in tasks.submit_runs(
            [{"play": NOOP, "org_id": o} for _ in range(70) for o in orgs])]
        for round_ in range(3):
            victim = Worker(worker_env(**env), concurrency=2, beat=False)
            victim.wait_ready()
            victims.append(victim)
            seen = len(starts(orgs))
            eventually(lambda seen=seen: len(starts(orgs)) >= seen + 15, timeout=60)
            os.killpg(victim.proc.pid, signal.SIGKILL)  # mid-publish, mid-start
            victim.proc.wait()
            del round_

        def launched() -> dict[str, int]:
            with session_scope(readonly=True) as session:
                return dict(session.execute(
                    sa.select(Attempt.run_id, sa.func.count()).where(
                        Attempt.run_id.in_(ids), Attempt.launch_id.is_not(None))
                    .group_by(Attempt.run_id)).all())
        # What the killed workers held comes back by lease and visibility timeouts: slow on
        # a loaded machine, and only "all, once" is the property here.
        eventually(lambda: len(launched()) == len(ids), timeout=240,
                   what="every run launched after the kills")
        assert set(launched().values()) == {1}  # none twice
    finally:
        keeper.stop()
        for v in victims:
            v.stop()


BIG = 10_000


def test_a_huge_backlog_keeps_the_broker_queue_short_and_a_newcomer_starts_promptly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    env = fast(600)  # window: ceil(10/s x 1 s) = 10 messages
    workers = fleet(monkeypatch, env)
    try:
        big, newcomer = org("huge"), org("new")
        for _ in range(BIG // 5000):
            submit(big, 5000)
        client = redis.Redis.from_url(TEST_REDIS_URL)
        lengths = []
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            lengths.append(client.llen(QUEUE))
            time.sleep(0.05)  # sampling the queue while it runs, not waiting for a state
        assert max(lengths) <= 10, max(lengths)
        assert len(starts([big])) >= 20
        before = len(starts([big]))
        submit(newcomer, 2)
        eventually(lambda: len(starts([newcomer])) == 2, timeout=30)
        order = [o for o, _, _ in starts([big, newcomer])]
        # Behind FIFO it would wait for ~10,000 starts; here for those already in the
        # window (10) and the one being picked.
        assert order[:order.index(newcomer)].count(big) - before <= 12
        with session_scope(readonly=True) as session:
            unsent = session.scalar(sa.select(sa.func.count()).select_from(Outbox).where(
                Outbox.org_id == big, Outbox.sent_at.is_(None)))
        assert (unsent or 0) > BIG - 1000  # the backlog stays in PostgreSQL
    finally:
        for w in workers:
            w.stop()
