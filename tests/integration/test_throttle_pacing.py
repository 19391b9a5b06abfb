"""A start told to wait by the fleet's start rate is paced, not failed: it comes back when
its permit is due and never spends the run's deferral count (bench/bench_providers.py
showed queued runs failing START_DEFERRAL_EXHAUSTED under a provider's steady limit)."""

from __future__ import annotations

import sqlalchemy as sa

import tasks
from models import Run
from tasks.acquisition.deferral import Verdict, defer
from tasks.settings import Settings
from tasks.store.db import session_scope
from tasks.store.fence import Fence
from tests.support.runs import closes_open_runs, must_claim, new_run, org_namer

ORG_PREFIX = "pace-"
org = org_namer(ORG_PREFIX)
_no_open_runs_left = closes_open_runs(ORG_PREFIX)


def due(run_id: str) -> Fence:
    """Claim the parked run at once, as its outbox row would once due."""
    with session_scope() as session:
        session.execute(sa.update(Run).where(Run.id == run_id).values(deferred_until=None))
    return must_claim(run_id)


def deferrals(run_id: str) -> list[dict[str, object]]:
    return [e.data for e in tasks.run_events(run_id) if e.kind == "run.deferred"]


def test_throttle_waits_do_not_spend_the_deferral_budget(pg_url: str) -> None:
    strict = Settings(deferral_max_count=2)
    run_id = new_run(org())
    for _ in range(5):  # more throttle waits than the budget allows deferrals
        assert defer(due(run_id), "throttle", strict, at_least_ms=800) is Verdict.DEFERRED
    seen = deferrals(run_id)
    assert [d["cause"] for d in seen] == ["throttle"] * 5
    assert all(800 <= int(str(d["delay_ms"])) <= 1000 for d in seen), seen
    view = tasks.get_run(run_id)
    assert view.status == "queued"
    # A real failure to start still spends the count and ends the run once it is spent.
    for _ in range(2):
        assert defer(due(run_id), "transport", strict) is Verdict.DEFERRED
    assert defer(due(run_id), "transport", strict) is Verdict.EXHAUSTED
    assert tasks.get_run(run_id).code == "START_DEFERRAL_EXHAUSTED"
