"""Work receipts after an attempt: what an ended attempt still holds is released (by its
release step, or by the reaper after a forced settlement), and the app-code views and the
CLI clear and show receipts. A real `playrun gateway` and real PostgreSQL, no worker."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import sqlalchemy as sa

import tasks
from models import WorkReceipt
from tasks.errors import InputInvalidError
from tasks.release.attempt import release_attempt
from tasks.release.receipts import release_orphans, release_receipts
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle_forced
from tasks.store.db import session_scope
from tests.support.paths import HELLO, ROOT
from tests.support.receipts import (
    ORG_PREFIX,
    act,
    claim,
    complete,
    launched,
    org,
    receipt,
    step_events,
)
from tests.support.runs import closes_open_runs
from tests.support.stack import Gateway, worker_env

_no_open_runs_left = closes_open_runs(ORG_PREFIX)


# --- release --------------------------------------------------------------------------------

def test_an_ended_attempt_releases_what_it_still_holds(gateway: Gateway) -> None:
    run = launched()
    for key in ("a", "b", "c"):
        claim(gateway, run, key)
    complete(gateway, run, "a", 1)
    assert release_receipts(run.fence.run_id, 1) == 0  # still live: nothing is touched
    act(gateway, run, {"action": "complete", "result": {"status": "succeeded", "output": 1}})
    assert release_receipts(run.fence.run_id, 1) == 2
    assert release_receipts(run.fence.run_id, 1) == 0
    assert [(r.key, r.status) for r in tasks.receipts(run.org_id)] == [
        ("a", "completed"), ("b", "released"), ("c", "released")]
    assert step_events(run)[-1] == ("receipts.released", {"count": 2})
    assert [k for k, _ in step_events(run)].count("receipts.released") == 1
    after = launched(run.org_id)
    assert claim(gateway, after, "b") == {"state": "run"}
    assert claim(gateway, after, "a")["state"] == "reuse"


def test_the_release_step_of_an_attempt_releases_its_receipts(gateway: Gateway) -> None:
    run = launched()
    claim(gateway, run, "k")
    release_attempt(run.fence.run_id, 1, run.fence.lease_token)  # still live: kept
    assert receipt(run.org_id, "k").status == "running"
    settle_forced(run.fence.run_id, Outcome.failed("RUNTIME_INTERNAL_ERROR", "test"), "test")
    release_attempt(run.fence.run_id, 1, run.fence.lease_token)
    assert receipt(run.org_id, "k").status == "released"
    assert step_events(run)[-1] == ("receipts.released", {"count": 1})


def test_the_reaper_releases_receipts_a_forced_settlement_left(gateway: Gateway) -> None:
    run = launched()
    claim(gateway, run, "k")
    settle_forced(run.fence.run_id, Outcome.failed("RUNTIME_INTERNAL_ERROR", "test"), "test")
    assert receipt(run.org_id, "k").status == "running"
    assert release_orphans() >= 1
    assert receipt(run.org_id, "k").status == "released"
    assert step_events(run)[-1] == ("receipts.released", {"count": 1})


# --- app code and the CLI -------------------------------------------------------------------

def test_clear_receipts_by_key_play_and_org(gateway: Gateway) -> None:
    a = launched()
    b = launched(a.org_id, HELLO)
    for run, keys in ((a, ("k1", "k2", "held")), (b, ("k1",))):
        for key in keys:
            claim(gateway, run, key)
            if key != "held":
                complete(gateway, run, key, key)
    assert tasks.clear_receipts(a.org_id, key="k1") == 2
    assert tasks.clear_receipts(a.org_id, play="noop", key="k1") == 0
    assert [r.key for r in tasks.receipts(a.org_id)] == ["held", "k2"]
    assert tasks.clear_receipts(a.org_id, play="plays/noop.py") == 1  # held ones stay
    assert [r.key for r in tasks.receipts(a.org_id)] == ["held"]
    assert tasks.clear_receipts(org()) == 0
    again = launched(a.org_id)
    assert claim(gateway, again, "k2") == {"state": "run"}  # cleared: the step runs again


@pytest.mark.parametrize(("args", "kwargs"), [
    (("",), {}), ((" ",), {}), (("x" * 200,), {}), ((None,), {}),
    (("acme",), {"play": ""}), (("acme",), {"key": "k" * 2000}),
])
def test_bad_arguments_are_refused(pg_url: str, args: tuple[Any, ...],
                                   kwargs: dict[str, Any]) -> None:
    if "key" not in kwargs:
        with pytest.raises(InputInvalidError):
            tasks.receipts(*args, **kwargs)
    with pytest.raises(InputInvalidError):
        tasks.clear_receipts(*args, **kwargs)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tasks.cli.main", "receipts", *args],
                          env=worker_env(COLUMNS="250"), cwd=str(ROOT), capture_output=True,
                          text=True, timeout=60)


def test_cli_show_and_clear(gateway: Gateway) -> None:
    run = launched()
    claim(gateway, run, "lookup:acme.com")
    complete(gateway, run, "lookup:acme.com", {"employees": 12})
    claim(gateway, run, "lookup:held.io")
    shown = cli("show", "--org", run.org_id)
    assert shown.returncode == 0, shown.stderr
    assert "lookup:acme.com" in shown.stdout and "completed" in shown.stdout
    assert '{"employees": 12}' in shown.stdout and "lookup:held.io" in shown.stdout
    # Piped, stdout is only the rows; the count goes to stderr.
    assert run.fence.run_id in shown.stdout and shown.stderr.strip() == "2 receipt(s)"
    assert cli("show", "--org", run.org_id, "--play", "hello").stderr.strip() == "0 receipt(s)"
    cleared = cli("clear", "--org", run.org_id, "--key", "lookup:acme.com")
    assert cleared.returncode == 0 and "cleared 1 receipt(s)" in cleared.stdout
    assert "lookup:acme.com" not in cli("show", "--org", run.org_id).stdout
    missing = cli("show")
    assert missing.returncode == 2 and "--org" in missing.stderr
    bad = cli("clear", "--org", " ")
    assert bad.returncode == 2 and "INPUT_INVALID" in bad.stderr
    assert len(tasks.receipts(run.org_id)) == 1
    with session_scope() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(WorkReceipt).where(
            WorkReceipt.org_id == run.org_id)) == 1
