"""The dashboard's fleet page: start-rate history per bucket, traffic policy, placement,
capacity."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import redis
from markupsafe import Markup

from tasks.acquisition import capacity, policy
from tasks.acquisition.fairshare import view as fair_view
from tasks.acquisition.pools import view as pools_view
from tasks.acquisition.starthistory import Sample, read_history
from tasks.dashboard.chart import render
from tasks.dashboard.placement import Placement, placement
from tasks.settings import Settings
from tasks.store.db import session_scope

log = logging.getLogger("playrun.dashboard")

MAX_ORGS = 200  # capacity rows shown; the rest are counted


@dataclass(frozen=True)
class BucketChart:
    bucket: str
    svg: Markup
    grants: int
    denials: int
    penalties: int
    rate: float | None  # the newest rate reported in the hour


@dataclass(frozen=True)
class OrgCapacity:
    org_id: str
    limit: int
    reserved: int
    live: int
    weight: int = 1  # its share of the start rate (fair order)
    backlog: int = 0  # queued runs


@dataclass(frozen=True)
class Fleet:
    charts: list[BucketChart]
    history_error: str | None  # Redis did not answer: the chart is missing, not empty
    policy: policy.Policy
    orgs: list[OrgCapacity]
    orgs_hidden: int
    default_limit: int
    capacity_mode: str
    start_order: str = "fair"
    placement: Placement | None = None
    # Warm pools: bounds, members by state and counters (tasks/acquisition/pools/view.py).
    pools: list[dict[str, Any]] = field(default_factory=list)


def _chart(bucket: str, samples: list[Sample]) -> BucketChart:
    rates = [s.rate for s in samples if s.rate is not None]
    return BucketChart(bucket, render(bucket, samples), sum(s.grants for s in samples),
                       sum(s.denials for s in samples), sum(s.penalties for s in samples),
                       rates[-1] if rates else None)


def fleet(settings: Settings) -> Fleet:
    charts: list[BucketChart] = []
    error = None
    try:
        charts = [_chart(b, s) for b, s in read_history().items()]
    except redis.RedisError as exc:
        log.warning("start-rate history unavailable: %s", exc)
        error = f"Redis did not answer ({type(exc).__name__})"
    with session_scope(readonly=True) as session:
        current = policy.current(session)
        waiting = fair_view.backlogs(session)
    rows = capacity.show(settings.org_capacity)
    placed = placement(settings, {r[0]: r[2] + r[3] for r in rows})
    listed = {r[0] for r in rows}
    rows += [(org, settings.org_capacity, 0, 0) for org in waiting if org not in listed]
    # Fullest first: the orgs an operator is asked about; then the longest backlogs.
    rows.sort(key=lambda r: (-(r[2] + r[3]) / max(r[1], 1), -waiting.get(r[0], 0), r[0]))
    shown = rows[:MAX_ORGS]
    with session_scope(readonly=True) as session:
        weights = fair_view.weights(session, [r[0] for r in shown])
    return Fleet(charts, error, current,
                 [OrgCapacity(*r, weights[r[0]], waiting.get(r[0], 0)) for r in shown],
                 max(0, len(rows) - MAX_ORGS), settings.org_capacity, settings.capacity_mode,
                 str(settings.start_order), placed, pools_view.show())
