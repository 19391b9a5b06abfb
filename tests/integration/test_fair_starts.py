"""Fair order of starts by org, end to end: real workers (beat included), PostgreSQL and
Redis, the `fake` provider with hosted runners (no runner host: a started run just holds
its sandbox, so only the order of starts matters here)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
import sqlalchemy as sa

import tasks
from models import Run, RunEvent
from tasks.acquisition import policy
from tasks.constants import QUEUE, EventKind
from tasks.sandbox import FakeScript
from tasks.settings import reset_settings
from tasks.store.db import session_scope
from tests.conftest import ROOT, SANDBOX_ROOT, TEST_REDIS_URL, Worker, worker_env
from tests.helpers import eventually
from tests.support import close_open_runs

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
        submit(small, 3)
        eventually(lambda: any(o == small for o, _, _ in starts([big, small])), timeout=30)
        order = [o for o, _, _ in starts([big, small])]
        first_small = order.index(small)
        # Under FIFO all 80 of big's would go first; fair: at most the window (the rate's
        # next second: 4) plus one, counted from the first start after the submit.
        ahead = sum(1 for o in order[5:first_small] if o == big)
        assert ahead <= 6, order[:first_small + 1]
        # And all of small's come before big is through its backlog.
        eventually(lambda: Counter(o for o, _, _ in starts([small]))[small] == 3, timeout=30)
        assert len(starts([big])) < 40
    finally:
        for w in workers:
            w.stop()
