"""State gauges read at scrape time by beat's endpoint (one beat per fleet: no duplicates).

Each scrape reads the start-rate bucket of each provider the fleet serves (one read-only
script call each), the held capacity leases grouped by org and state (one indexed query,
bounded by the sum of org limits) and the sandboxes live by provider. A source that does
not answer is reported by `playrun_state_source_up` = 0 instead of failing the scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis import RedisError

from models import CapacityLease, CapacityOrg
from tasks.acquisition import permits, placement_view
from tasks.acquisition import policy as traffic
from tasks.acquisition.fairshare import view as fair_view
from tasks.acquisition.pools import view as pools_view
from tasks.acquisition.startrate import rules_for
from tasks.constants import LEASE_HELD, POOL_STATS
from tasks.observe import metrics
from tasks.settings import Settings
from tasks.store.db import session_scope

log = logging.getLogger("playrun.metrics")


class StateCollector(Collector):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("playrun_state_source_up",
                               "1 if the last scrape could read this source.",
                               labels=["source"])
        held: dict[str, dict[str, int]] | None = None
        limits: dict[str, int] = {}
        waiting: dict[str, int] = {}
        weights: dict[str, int] = {}
        override: float | None = None
        live: dict[str, int] = {}
        pools: list[dict[str, Any]] = []
        try:
            with session_scope(readonly=True) as session:
                policy = traffic.current(session)
                override = policy.starts_per_minute if policy.mode == traffic.THROTTLE else None
                held = metrics.top_orgs(_held_by_org(session), self.settings.metrics_top_orgs)
                limits = _limits(session, [o for o in held if o != metrics.OTHER_ORGS],
                                 self.settings.org_capacity)
                waiting = fair_view.top(fair_view.backlogs(session),
                                        self.settings.metrics_top_orgs, metrics.OTHER_ORGS)
                weights = fair_view.weights(session, [o for o in {*waiting, *limits}
                                                      if o != metrics.OTHER_ORGS])
                live = placement_view.live_by_provider(session)
            pools = pools_view.show()
        except sa.exc.SQLAlchemyError as exc:
            log.warning("metrics: the database did not answer: %s", exc)
        up.add_metric(["database"], 0.0 if held is None else 1.0)
        rates = self._rates(override)
        up.add_metric(["redis"], 0.0 if rates is None else 1.0)
        yield up
        if rates is not None:
            yield from rates
        if held is not None:
            yield _capacity(held)
            limit = GaugeMetricFamily("playrun_capacity_limit",
                                      "Concurrent sandboxes allowed, for the orgs named in "
                                      "playrun_capacity_leases.", labels=["org"])
            for org, n in limits.items():
                limit.add_metric([org], float(n))
            yield limit
            yield from _fair(waiting, weights)
            yield _live(live, self.settings.served)
            yield from _pools(pools)

    def _rates(self, override: float | None) -> list[Metric] | None:
        rate = GaugeMetricFamily("playrun_start_rate_per_second",
                                 "Current start rate of each bucket rule (an operator "
                                 "throttle replaces the adaptive rate).",
                                 labels=["bucket", "rule"])
        cooldown = GaugeMetricFamily("playrun_start_rate_cooldown_seconds",
                                     "Seconds left of the rule's pushback cooldown.",
                                     labels=["bucket", "rule"])
        for bucket in self.settings.served:  # each provider's own bucket
            rules = rules_for(self.settings, bucket, override)
            try:
                states = permits.limiter().inspect(bucket, rules)
            except RedisError as exc:  # inspect degrades by itself; this is the last resort
                log.warning("metrics: the start-rate bucket did not answer: %s", exc)
                return None
            if any(s.degraded for s in states):
                return None
            for rule, state in zip(rules, states, strict=True):
                per_min = (state.rate if state.exists
                           else (rule.fixed_per_min or rule.initial_per_min))
                rate.add_metric([bucket, rule.name], per_min / 60.0)
                left_us = max(state.cooldown_until_us - state.server_now_us, 0)
                cooldown.add_metric([bucket, rule.name], left_us / 1e6)
        return [rate, cooldown]


def _held_by_org(session: sa.orm.Session) -> dict[str, dict[str, int]]:
    held: dict[str, dict[str, int]] = {}
    for org, state, n in session.execute(
        sa.select(CapacityLease.org_id, CapacityLease.state, sa.func.count())
        .where(CapacityLease.state.in_(LEASE_HELD))
        .group_by(CapacityLease.org_id, CapacityLease.state)
    ):
        held.setdefault(org, {})[state] = int(n)
    return held


def _limits(session: sa.orm.Session, orgs: list[str], default: int) -> dict[str, int]:
    """Each org's limit: its override in SQL, else the default (one query for all)."""
    rows = session.execute(sa.select(CapacityOrg.org_id, CapacityOrg.limit).where(
        CapacityOrg.org_id.in_(orgs))).all() if orgs else []
    overrides = {org: n for org, n in rows if n is not None}
    return {org: overrides.get(org, default) for org in orgs}


def _fair(waiting: dict[str, int], weights: dict[str, int]) -> Iterator[Metric]:
    backlog = GaugeMetricFamily("playrun_backlog_runs",
                                "Queued runs waiting to start, by org (top N by backlog, the "
                                "rest as \"other\").", labels=["org"])
    for org, n in waiting.items():
        backlog.add_metric([org], float(n))
    yield backlog
    weight = GaugeMetricFamily("playrun_org_weight",
                               "Each named org's weight in the fair order of starts.",
                               labels=["org"])
    for org, w in weights.items():
        weight.add_metric([org], float(w))
    yield weight


def _pools(pools: list[dict[str, Any]]) -> Iterator[Metric]:
    members = GaugeMetricFamily("playrun_pool_sandboxes",
                                "Warm pool sandboxes by pool and state (ready, claiming, "
                                "refilling, retiring).", labels=["pool", "provider", "state"])
    events = CounterMetricFamily("playrun_pool_events",
                                 "Warm pool claims, misses, refills and expiries, fleet-wide "
                                 "(counted in Redis).", labels=["pool", "event"])
    for p in pools:
        for state in ("ready", "claiming", "refilling", "retiring"):
            members.add_metric([p["name"], p["provider"], state], float(p[state]))
        for event in POOL_STATS:
            events.add_metric([p["name"], event], float(p[event]))
    yield members
    yield events


def _capacity(by_org: dict[str, dict[str, int]]) -> Metric:
    gauge = GaugeMetricFamily("playrun_capacity_leases",
                              "Capacity leases held now, by org (top N by leases held, the "
                              "rest as \"other\") and state.", labels=["org", "state"])
    for org, states in by_org.items():
        for state, n in states.items():
            gauge.add_metric([org, state], float(n))
    return gauge


def _live(by_provider: dict[str, int], served: tuple[str, ...]) -> Metric:
    gauge = GaugeMetricFamily("playrun_provider_sandboxes_live",
                              "Sandboxes recorded live now, by provider (every provider the "
                              "fleet serves, 0 included).", labels=["provider"])
    for name in sorted({*served, *by_provider}):
        gauge.add_metric([name], float(by_provider.get(name, 0)))
    return gauge
