"""Metrics in one process: bounded org labels (pure and from the database), terminals
counted once by the writer that won and never on a rollback, what Flower is shown of
task arguments, gateway effects read from replies, and endpoint addresses."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from models import CapacityLease
from tasks.acquisition import capacity
from tasks.broker.taskrepr import shown
from tasks.constants import (
    LEASE_HELD,
    TASK_INSPECT_ATTEMPT,
    TASK_RELEASE_ATTEMPT,
    TASK_RELEASE_ATTEMPTS,
    TASK_START_ATTEMPT,
    RunStatus,
)
from tasks.errors import ConfigurationError
from tasks.gateway import observe
from tasks.maintenance.state_metrics import StateCollector
from tasks.observe import metrics
from tasks.settings import Settings, get_settings, parse_addr
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle
from tasks.store.db import after_commit, session_scope
from tests.support.runs import close_open_runs, must_claim, new_run, reserve

ORGS = "mu-"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture(autouse=True)
def fresh_metrics() -> Iterator[None]:
    metrics.reset()
    yield
    metrics.reset()


def test_top_orgs_names_at_most_n_and_sums_the_rest_under_other() -> None:
    held = {f"org-{i:02d}": {"live": i % 7, "reserved": i % 3} for i in range(50)}
    bounded = metrics.top_orgs(held, 5)
    assert len(bounded) == 6 and metrics.OTHER_ORGS in bounded
    ranked = sorted(held, key=lambda o: (-sum(held[o].values()), o))
    assert set(bounded) - {metrics.OTHER_ORGS} == set(ranked[:5])
    for state in ("live", "reserved"):
        assert sum(b[state] for b in bounded.values()) == sum(h[state] for h in held.values())
        assert bounded[metrics.OTHER_ORGS][state] == sum(held[o][state] for o in ranked[5:])
    assert metrics.top_orgs(held, 0).keys() == {metrics.OTHER_ORGS}
    assert metrics.top_orgs({"a": {"live": 1}}, 5) == {"a": {"reserved": 0, "live": 1}}
    assert metrics.top_orgs({}, 5) == {}


def test_the_capacity_gauge_from_the_database_is_bounded(pg_url: str) -> None:
    sizes = {f"{ORGS}{uuid.uuid4().hex[:6]}-{n}": n for n in (4, 3, 2, 1, 1)}
    try:
        for org, n in sizes.items():
            for _ in range(n):
                reserve(must_claim(new_run(org)), org)
        biggest = sorted(sizes, key=lambda o: -sizes[o])[:2]
        capacity.set_limit(biggest[0], 7)
        settings = get_settings().model_copy(update={"metrics_top_orgs": 2})
        families = {f.name: f for f in StateCollector(settings).collect()}
        up = {s.labels["source"]: s.value for s in families["playrun_state_source_up"].samples}
        assert up["database"] == 1.0
        samples = families["playrun_capacity_leases"].samples
        named = {s.labels["org"] for s in samples}
        assert named == {*biggest, metrics.OTHER_ORGS}
        reserved = {s.labels["org"]: s.value for s in samples if s.labels["state"] == "reserved"}
        assert [reserved[o] for o in biggest] == [4.0, 3.0]
        with session_scope() as s:
            total = s.scalar(sa.select(sa.func.count()).where(
                CapacityLease.state.in_(LEASE_HELD)))
        assert sum(x.value for x in samples) == total  # nothing lost in "other"
        limits = {s.labels["org"]: s.value for s in families["playrun_capacity_limit"].samples}
        assert limits == {biggest[0]: 7.0, biggest[1]: float(settings.org_capacity)}
    finally:
        close_open_runs(ORGS)


def test_a_terminal_is_counted_once_by_the_settle_that_won(pg_url: str) -> None:
    before = value("playrun_runs_ended_total", status="succeeded", code="none")
    timed = value("playrun_submit_to_terminal_seconds_count", status="succeeded")
    fence = must_claim(new_run(f"{ORGS}{uuid.uuid4().hex[:6]}"))
    first = settle(fence, Outcome(RunStatus.SUCCEEDED, output={}), reason="ended")
    second = settle(fence, Outcome(RunStatus.SUCCEEDED, output={}), reason="ended")
    assert first.won and not second.won
    assert value("playrun_runs_ended_total", status="succeeded", code="none") == before + 1
    assert value("playrun_submit_to_terminal_seconds_count", status="succeeded") == timed + 1


def test_after_commit_hooks_run_only_once_committed(pg_url: str) -> None:
    ran: list[str] = []
    with session_scope() as s:
        after_commit(s, lambda: ran.append("committed"))
        s.execute(sa.text("SELECT 1"))
        assert ran == []
    assert ran == ["committed"]
    with pytest.raises(RuntimeError), session_scope() as s:
        after_commit(s, lambda: ran.append("rolled back"))
        raise RuntimeError("the transaction fails")
    assert ran == ["committed"]
    with session_scope() as s:  # a hook that fails is logged; the commit stands, others run
        after_commit(s, lambda: print(1 / 0))
        after_commit(s, lambda: ran.append("after a failing one"))
    assert ran == ["committed", "after a failing one"]


def test_disabled_metrics_record_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.settings import reset_settings

    monkeypatch.setenv("PLAYRUN_METRICS_ENABLED", "false")
    reset_settings()
    metrics.reset()
    try:
        metrics.deferred("hold")
        assert not metrics.enabled()
        assert REGISTRY.get_sample_value("playrun_deferrals_total", {"cause": "hold"}) is None
    finally:
        monkeypatch.undo()
        reset_settings()


def test_flower_is_shown_the_run_and_never_a_token() -> None:
    token = "tok-" + uuid.uuid4().hex
    assert shown(TASK_START_ATTEMPT, ["r1"]) == "run_id=r1"
    assert shown(TASK_RELEASE_ATTEMPT, ["r1", 2, token]) == "run_id=r1, generation=2"
    holders = [[f"r{i}", 1, token] for i in range(12)]
    assert shown(TASK_RELEASE_ATTEMPTS, [holders]) == (
        "runs=" + ",".join(f"r{i}" for i in range(10)) + " (+2 more)")
    assert shown(TASK_RELEASE_ATTEMPTS, ["not a list"]) == ""
    assert shown(TASK_INSPECT_ATTEMPT, ["r1", 2, token]) == "run_id=r1, generation=2"
    assert shown("playrun.some_new_task", [token, {"input": "x"}]) == "(2 args)"
    assert shown(TASK_START_ATTEMPT, ["x" * 500]) == "run_id=" + "x" * 64


def test_gateway_effects_count_what_the_replies_say() -> None:
    observe.effects("step_claim", {"state": "reuse", "output": 1})
    observe.effects("step_claim", {"state": "run"})
    observe.effects("step_complete", {"state": "completed", "duplicate": False})
    observe.effects("step_complete", {"state": "completed", "duplicate": True})
    observe.effects("sheet_write", {"written": 3, "rejected": [
        {"key": "a", "reason": "newer_write_version"}, {"key": "b", "reason": "made up"}]})
    observe.effects("sheet_start_with_intent", {"superseded": [
        {"key": "c", "reason": "newer_write_version"}]})
    assert value("playrun_receipts_total", outcome="reused") == 1
    assert value("playrun_receipts_total", outcome="executed") == 1
    assert value("playrun_sheet_rows_written_total") == 3
    assert value("playrun_sheet_rows_rejected_total", reason="newer_write_version") == 2
    assert value("playrun_sheet_rows_rejected_total", reason="other") == 1
    assert observe.request_label([], batch=False) == observe.UNKNOWN
    assert observe.request_label(["heartbeat", "complete"], batch=True) == observe.BATCH


@pytest.mark.parametrize(("text", "parsed"), [("127.0.0.1:9464", ("127.0.0.1", 9464)),
                                              ("0.0.0.0:0", ("0.0.0.0", 0)),
                                              ("[::1]:9465", ("::1", 9465))])
def test_metrics_addresses(text: str, parsed: tuple[str, int]) -> None:
    assert parse_addr(text) == parsed


@pytest.mark.parametrize("text", ["9464", "localhost", ":9464", "host:port", "h:70000", ""])
def test_bad_metrics_addresses_are_a_coded_error(text: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings(metrics_gateway_addr=text).check()  # every process refuses it at start
    assert caught.value.code == "CONFIG_INVALID"


def test_the_gateway_metrics_never_share_the_runtime_port() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings(gateway_url="http://127.0.0.1:8765",
                 metrics_gateway_addr="127.0.0.1:8765").check()
    assert "runtime port" in caught.value.message
