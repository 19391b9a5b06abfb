"""Every Prometheus metric of playrun, and the one-line calls that record them.

Counters are incremented where the fact becomes true (after the commit that made it so,
by the writer that won), so they are exact. State (start rates, capacity per org) is
read at scrape time by beat's collector (tasks/maintenance/state_metrics.py), never
kept up to date on the hot path.

Metric objects are built on first use, not at import: a worker switches the process to
prometheus_client's multiprocess mode at start-up, before any value exists.
`PLAYRUN_METRICS_ENABLED=false` makes every call here a no-op.

Label values are bounded: buckets are provider names, codes and causes are ours,
gateway actions come from the action table (anything else is "unknown"), orgs go
through `top_orgs`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache

from prometheus_client import REGISTRY, Counter, Histogram

from tasks.constants import LeaseState
from tasks.settings import get_settings

OTHER_ORGS = "other"
LEASE_STATES = (LeaseState.RESERVED, LeaseState.LIVE)
# Seconds: a queued run waits from milliseconds (idle fleet) to many minutes (deferrals).
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                    900.0, 1800.0, 3600.0)
_GATEWAY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _Metrics:
    def __init__(self) -> None:
        self.admitted = Counter("playrun_runs_admitted_total",
                                "Runs admitted by submit_run (counted by the app process).")
        self.ended = Counter("playrun_runs_ended_total",
                             "Runs that reached a terminal status, by status and code.",
                             ["status", "code"])
        self.to_terminal = Histogram("playrun_submit_to_terminal_seconds",
                                     "From submit to the terminal write, by status.",
                                     ["status"], buckets=_LATENCY_BUCKETS)
        self.to_start = Histogram("playrun_submit_to_start_seconds",
                                  "From submit to the runner launched in its sandbox.",
                                  buckets=_LATENCY_BUCKETS)
        self.permits = Counter("playrun_start_permits_total",
                               "Start-rate permit decisions, by bucket and decision.",
                               ["bucket", "decision"])
        self.penalties = Counter("playrun_start_rate_penalties_total",
                                 "Provider pushback that cut a bucket's rate (once per epoch).",
                                 ["bucket"])
        self.starts = Counter("playrun_starts_total",
                              "Start permits granted, by org (this process names at most "
                              "PLAYRUN_METRICS_TOP_ORGS, the rest \"other\").", ["org"])
        self.creates = Counter("playrun_provider_creates_total",
                               "Sandbox creates, by provider and result (ok or error kind).",
                               ["provider", "result"])
        self.failovers = Counter("playrun_placement_failovers_total",
                                 "Attempts passed from a provider to the next, by provider "
                                 "left and cause.", ["provider", "cause"])
        self.placements = Counter("playrun_placements_total",
                                  "Providers placement chose, by provider and reason.",
                                  ["provider", "reason"])
        self.pool_claims = Counter("playrun_pool_claims_total",
                                   "Starts that asked a warm pool, by pool and result "
                                   "(claimed, missed).", ["pool", "result"])
        self.deferrals = Counter("playrun_deferrals_total",
                                 "Pre-code deferrals scheduled, by cause.", ["cause"])
        self.runners_lost = Counter("playrun_runners_lost_total",
                                    "Runs settled RUNTIME_RUNNER_LOST.")
        self.gateway = Counter("playrun_gateway_requests_total",
                               "Gateway runtime requests, by action and answer code.",
                               ["action", "code"])
        self.refusals = Counter("playrun_gateway_refusals_total",
                                "Requests of a valid token the gateway refused before any "
                                "action ran, by org (this process names at most "
                                "PLAYRUN_METRICS_TOP_ORGS, the rest \"other\") and code.",
                                ["org", "code"])
        self.gateway_seconds = Histogram("playrun_gateway_request_duration_seconds",
                                         "Gateway runtime request latency, by action.",
                                         ["action"], buckets=_GATEWAY_BUCKETS)
        self.receipts = Counter("playrun_receipts_total",
                                "ctx.step outcomes: reused (stored output), executed, failed.",
                                ["outcome"])
        self.rows_written = Counter("playrun_sheet_rows_written_total",
                                    "Runtime sheet row results written.")
        self.rows_rejected = Counter("playrun_sheet_rows_rejected_total",
                                     "Runtime sheet rows refused, by reason.", ["reason"])

    def unregister(self) -> None:
        for metric in vars(self).values():
            REGISTRY.unregister(metric)


_BUILDING = threading.Lock()


def _get() -> _Metrics | None:
    # One build: two request threads ending their first runs at once would register twice.
    if _built.cache_info().currsize:
        return _built()
    with _BUILDING:
        return _built()


@lru_cache(maxsize=1)
def _built() -> _Metrics | None:
    return _Metrics() if get_settings().metrics_enabled else None


def reset() -> None:
    """Forget the metric objects (the worker switching to multiprocess mode; tests)."""
    with _BUILDING:
        if _built.cache_info().currsize:
            built = _built()
            if built is not None:
                built.unregister()
        _built.cache_clear()


def enabled() -> bool:
    return _get() is not None


def _since(created_at: datetime | None) -> float | None:
    if created_at is None:
        return None
    # The host clock against the database's: skew only shifts the figure, never below 0.
    return max((datetime.now(UTC) - created_at).total_seconds(), 0.0)


# --- the calls -------------------------------------------------------------------------

def run_admitted() -> None:
    runs_admitted(1)


def runs_admitted(count: int) -> None:
    if count and (m := _get()) is not None:
        m.admitted.inc(count)


def run_ended(status: str, code: str | None, created_at: datetime | None,
              runner_lost: bool) -> None:
    if (m := _get()) is None:
        return
    m.ended.labels(status, code or "none").inc()
    if (took := _since(created_at)) is not None:
        m.to_terminal.labels(status).observe(took)
    if runner_lost:
        m.runners_lost.inc()


def run_started(created_at: datetime | None) -> None:
    if (m := _get()) is not None and (took := _since(created_at)) is not None:
        m.to_start.observe(took)


def permit(bucket: str, granted: bool) -> None:
    if (m := _get()) is not None:
        m.permits.labels(bucket, "granted" if granted else "denied").inc()


_start_orgs: set[str] = set()
_refusal_orgs: set[str] = set()


def _org_label(named: set[str], org: str) -> str:
    """The first PLAYRUN_METRICS_TOP_ORGS orgs a counter meets are named, the rest "other"."""
    if org not in named:
        if len(named) >= get_settings().metrics_top_orgs:
            return OTHER_ORGS
        named.add(org)
    return org


def start(org: str) -> None:
    """A start permit granted to one of `org`'s runs."""
    if (m := _get()) is not None:
        m.starts.labels(_org_label(_start_orgs, org)).inc()


def penalty(bucket: str) -> None:
    if (m := _get()) is not None:
        m.penalties.labels(bucket).inc()


def provider_create(provider: str, result: str) -> None:
    if (m := _get()) is not None:
        m.creates.labels(provider, result).inc()


def failover(provider: str, cause: str) -> None:
    if (m := _get()) is not None:
        m.failovers.labels(provider, cause).inc()


def placed(provider: str, reason: str) -> None:
    if (m := _get()) is not None:
        m.placements.labels(provider, reason.split(" ", 1)[0]).inc()


def pool_claim(pool: str, result: str) -> None:
    if (m := _get()) is not None:
        m.pool_claims.labels(pool, result).inc()


def deferred(cause: str) -> None:
    if (m := _get()) is not None:
        m.deferrals.labels(cause).inc()


def gateway_request(action: str, code: str, seconds: float) -> None:
    if (m := _get()) is not None:
        m.gateway.labels(action, code).inc()
        m.gateway_seconds.labels(action).observe(seconds)


def gateway_refusal(org: str, code: str) -> None:
    """One request of a valid token refused; `code` is one of ours (tasks/errors.py)."""
    if (m := _get()) is not None:
        m.refusals.labels(_org_label(_refusal_orgs, org), code).inc()


def receipt(outcome: str) -> None:
    if (m := _get()) is not None:
        m.receipts.labels(outcome).inc()


def sheet_rows(written: int, rejected_reasons: list[str]) -> None:
    if (m := _get()) is None:
        return
    if written:
        m.rows_written.inc(written)
    for reason in rejected_reasons:
        m.rows_rejected.labels(reason).inc()


# --- bounded org labels ----------------------------------------------------------------

def top_orgs(held: Mapping[str, Mapping[str, int]], n: int) -> dict[str, dict[str, int]]:
    """Per-org lease counts with at most n orgs named (most held first, then by id) and
    the rest summed under "other", so the label set stays bounded however many orgs."""
    ranked = sorted(held, key=lambda org: (-sum(held[org].values()), org))
    out: dict[str, dict[str, int]] = {}
    for i, org in enumerate(ranked):
        label = org if i < n else OTHER_ORGS
        into = out.setdefault(label, dict.fromkeys(LEASE_STATES, 0))
        for state in LEASE_STATES:
            into[state] += held[org].get(state, 0)
    return out
