"""Settlement rules: cancel requested before any terminal wins; a holder whose lease ran
out releases nothing (the reaper settles from the sandbox); JSONB-hostile JSON is refused."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

import tasks
from models import Attempt, db_now
from tasks.constants import RunStatus
from tasks.release.finish import finish
from tasks.settlement.outcome import Outcome, from_result
from tasks.settlement.terminal import settle
from tasks.store.db import session_scope
from tests.support.runs import lease, must_claim, new_run, reserve


def test_a_cancel_recorded_before_the_terminal_wins(pg_url: str) -> None:
    f = must_claim(new_run(f"org-{uuid.uuid4().hex[:8]}"), "A")
    tasks.cancel_run(f.run_id)
    settled = settle(f, Outcome(RunStatus.SUCCEEDED, output={"late": True}), reason="ended")
    assert settled.won and settled.outcome.status == "cancelled"
    view = tasks.get_run(f.run_id)
    assert (view.status, view.code, view.output) == ("cancelled", "CANCELLED", None)


def _set_lease(run_id: str, seconds_from_now: float) -> None:
    with session_scope() as s:
        s.execute(sa.update(Attempt).where(Attempt.run_id == run_id)
                  .values(lease_expires_at=db_now(seconds_from_now)))


def test_a_holder_whose_lease_ran_out_releases_nothing(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"
    f = must_claim(new_run(org), "A")
    lease_id = reserve(f, org)
    _set_lease(f.run_id, -1)  # the lease runs out (a long stall), nobody adopted yet
    with caplog.at_level(logging.WARNING, logger="playrun.finish"):
        assert finish(f, Outcome(RunStatus.SUCCEEDED, output={}), "ended") is None
    assert f"run {f.run_id} not settled yet" in caplog.text  # it tried, and left it
    assert tasks.get_run(f.run_id).status == "running"
    assert lease(lease_id)[0] == "reserved"  # kept for the reaper, which owns it next
    # The same call with the lease intact settles and releases: the refusal above was
    # the expired lease, not a finish() that does nothing.
    _set_lease(f.run_id, 30)
    settled = finish(f, Outcome(RunStatus.SUCCEEDED, output={"n": 1}), "ended")
    assert settled is not None and settled.won
    assert (tasks.get_run(f.run_id).status, lease(lease_id)[0]) == ("succeeded", "released")


def test_nan_and_infinity_are_not_json() -> None:
    bad = from_result(b'{"status": "succeeded", "output": {"x": NaN}}')
    assert (bad.status, bad.code) == ("failed", "OUTPUT_INVALID")
    inf = from_result(b'{"status": "succeeded", "output": [1e999]}')
    assert (inf.status, inf.code) == ("failed", "OUTPUT_INVALID")


def test_the_upgrade_gives_rows_in_flight_their_holder(tmp_path: Path) -> None:
    from tasks.store import db

    url = f"sqlite:///{tmp_path / 'mig.db'}"
    db.upgrade(url, "0001")
    engine = db.get_engine(url)
    with engine.begin() as c:
        c.execute(sa.text("INSERT INTO play_bundles (digest, source, size) VALUES ('d', 's', 1)"))
        c.execute(sa.text(
            "INSERT INTO runs (id, org_id, play_path, play_digest, status, current_generation, "
            "deferral_count, deferral_total_ms) VALUES ('r', 'o', 'p', 'd', 'running', 1, 0, 0)"))
        c.execute(sa.text(
            "INSERT INTO attempts (id, run_id, generation, lease_token, lease_expires_at, state, "
            "events_offset) VALUES ('a', 'r', 1, 'tok', '2030-01-01 00:00:00.000000', "
            "'active', 0)"))
        c.execute(sa.text(
            "INSERT INTO capacity_leases (id, org_id, run_id, generation, state, overrun) "
            "VALUES ('l', 'o', 'r', 1, 'live', 0)"))
    db.upgrade(url)
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT holder_token FROM capacity_leases")).scalar() == "tok"
