"""The `playrun` commands an operator types, on SQLite (typer's CliRunner): submit, show,
cancel, stats, the traffic policy and per-org capacity, and their refusals."""

from __future__ import annotations

import json
import uuid

import pytest
from click.testing import CliRunner
from typer.main import get_command

import tasks
from tasks.acquisition import policy
from tasks.broker.publish import StubPublisher
from tasks.cli.main import app
from tasks.constants import TASK_START_ATTEMPT
from tasks.settings import get_settings
from tests.support.paths import HELLO

runner = CliRunner()
COMMAND = get_command(app)  # built once, not at every invoke


@pytest.fixture
def cli(sqlite_db: str, published: StubPublisher) -> StubPublisher:
    return published


def ok(*args: str) -> str:
    result = runner.invoke(COMMAND, list(args))
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def refused(*args: str) -> str:
    result = runner.invoke(COMMAND, list(args))
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    return result.output


def test_submit_prints_the_id_and_publishes_its_start(cli: StubPublisher) -> None:
    org = f"cli-{uuid.uuid4().hex[:6]}"
    run_id = ok("submit", str(HELLO), "--input", '{"name": "Ada"}', "--org", org,
                "--key", "k1").strip()
    assert [(m.name, m.args) for m in cli.sent] == [(TASK_START_ATTEMPT, [run_id])]
    view = tasks.get_run(run_id)
    assert (view.org_id, view.idempotency_key, view.status) == (org, "k1", "queued")
    # The same key and input is the same run; another input under it is refused.
    assert ok("submit", str(HELLO), "--input", '{"name": "Ada"}', "--org", org,
              "--key", "k1").strip() == run_id
    assert "IDEMPOTENCY_CONFLICT" in refused("submit", str(HELLO), "--org", org, "--key", "k1")
    shown = json.loads(ok("show", run_id[:16], "--json"))
    assert (shown["id"], shown["status"]) == (run_id, "queued")
    assert "run.admitted" in ok("show", run_id)


def test_submit_refuses_bad_input_a_directory_and_a_broker_that_is_down(
        cli: StubPublisher) -> None:
    assert "INPUT_INVALID" in refused("submit", str(HELLO), "--input", "{not json")
    assert "PLAY_INVALID" in refused("submit", str(HELLO.parent))
    cli.fail = ConnectionError("refused")
    out = refused("submit", str(HELLO))
    assert "BROKER_UNAVAILABLE" in out and "is committed" in out


def test_cancel_prints_the_cancelled_run(cli: StubPublisher) -> None:
    run_id = ok("submit", str(HELLO)).strip()
    doc = json.loads(ok("cancel", run_id))
    assert (doc["id"], doc["status"], doc["code"]) == (run_id, "cancelled", "CANCELLED")
    assert "RUN_NOT_FOUND" in refused("cancel", "f" * 32)


def test_stats_count_what_the_window_holds(cli: StubPublisher) -> None:
    cancelled = ok("submit", str(HELLO)).strip()
    ok("cancel", cancelled)
    ok("submit", str(HELLO))
    doc = json.loads(ok("stats", "--since", "30m"))
    assert doc["runs_by_status"] == {"cancelled": 1, "queued": 1}
    assert "DURATION_INVALID" in refused("stats", "--since", "forever")


def test_the_traffic_policy_holds_throttles_and_returns_to_normal(cli: StubPublisher) -> None:
    assert json.loads(ok("policy", "show"))["mode"] == "normal"
    held = json.loads(ok("policy", "hold", "--for", "10m", "--reason", "incident"))
    assert held["mode"] == policy.HOLD and held["expires_at"].endswith("Z")
    throttled = json.loads(ok("policy", "throttle", "30", "--for", "1h"))
    assert (throttled["mode"], throttled["sandbox_starts_per_minute"]) == (policy.THROTTLE, 30)
    assert "POLICY_INVALID" in refused("policy", "throttle", "-5")
    assert json.loads(ok("policy", "normal")) == {
        "mode": "normal", "sandbox_starts_per_minute": None, "expires_at": None}


def test_capacity_overrides_are_set_shown_and_removed(cli: StubPublisher) -> None:
    shown = ok("capacity", "set", "acme", "3")
    assert shown.splitlines()[0].startswith("default limit ")
    assert [line.split("\t")[:2] for line in shown.splitlines() if line.startswith("acme")] == [
        ["acme", "3"]]
    refused("capacity", "set", "acme", "many")
    default = str(get_settings().org_capacity)
    assert default != "3"
    unset = ok("capacity", "unset", "acme")
    assert [line.split("\t")[:2] for line in unset.splitlines() if line.startswith("acme")] in (
        [], [["acme", default]])
