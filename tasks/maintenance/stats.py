"""Operator figures, computed from durable state: the ledger, runs, leases, the bucket.

Deriving them from SQL (rather than counters kept beside it) means they survive
restarts and always agree with what `playrun show` says about each run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from models import CapacityLease, Run, RunEvent, db_now
from tasks.acquisition.capacity import HELD
from tasks.constants import TERMINAL_EVENT, EventKind
from tasks.store.db import session_scope


@dataclass
class Stats:
    window_s: float
    runs_by_status: dict[str, int] = field(default_factory=dict)
    terminals: dict[str, int] = field(default_factory=dict)  # "failed:PLAY_ERROR" -> n
    deferrals_by_cause: dict[str, int] = field(default_factory=dict)
    overruns_by_org: dict[str, int] = field(default_factory=dict)
    sandbox_starts: int = 0
    leases_held_by_org: dict[str, int] = field(default_factory=dict)


def collect(window_s: float) -> Stats:
    stats = Stats(window_s)
    since = db_now(-window_s)
    with session_scope(readonly=True) as session:
        stats.runs_by_status = {s: n for s, n in session.execute(
            sa.select(Run.status, sa.func.count()).group_by(Run.status))}
        recent = session.execute(
            sa.select(RunEvent.kind, RunEvent.data, Run.org_id)
            .join(Run, Run.id == RunEvent.run_id)
            .where(RunEvent.at >= since,
                   RunEvent.kind.in_([*TERMINAL_EVENT.values(), EventKind.DEFERRED,
                                      EventKind.CAPACITY_OVERRUN, EventKind.SANDBOX_REQUESTED]))
        ).all()
        stats.leases_held_by_org = {o: n for o, n in session.execute(
            sa.select(CapacityLease.org_id, sa.func.count())
            .where(CapacityLease.state.in_(HELD)).group_by(CapacityLease.org_id))}
    terminals: Counter[str] = Counter()
    deferrals: Counter[str] = Counter()
    overruns: Counter[str] = Counter()
    for kind, data, org in recent:
        data = data or {}
        if kind == EventKind.DEFERRED:
            deferrals[str(data.get("cause"))] += 1
        elif kind == EventKind.CAPACITY_OVERRUN:
            overruns[org] += 1
        elif kind == EventKind.SANDBOX_REQUESTED:
            stats.sandbox_starts += 1
        else:
            status = kind.split(".", 1)[1]
            terminals[f"{status}:{data.get('code') or '-'}"] += 1
    stats.terminals = dict(terminals)
    stats.deferrals_by_cause = dict(deferrals)
    stats.overruns_by_org = dict(overruns)
    return stats


def as_dict(stats: Stats) -> dict[str, Any]:
    return dict(stats.__dict__)
