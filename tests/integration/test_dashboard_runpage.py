"""What the dashboard's run page reads: deferrals, sheets taken over, steps, ledger pages."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from models import RunEvent
from tasks.acquisition import deferral
from tasks.broker.publish import StubPublisher
from tasks.constants import EventKind
from tasks.dashboard.runpage import FailureClass, SheetPanel, failure_class, run_page
from tasks.errors import RunNotFoundError
from tasks.settings import get_settings
from tasks.sheets import store
from tasks.store.db import session_scope
from tests.support.runs import close_open_runs, must_claim, new_run

ORG_PREFIX = "dpg-"


@pytest.fixture
def org(pg_url: str) -> Iterator[str]:
    yield f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}"
    close_open_runs(ORG_PREFIX)


def test_a_deferred_attempt_shows_its_cause_and_next_retry(
        org: str, published: StubPublisher) -> None:
    run_id = new_run(org)
    fence = must_claim(run_id)
    assert deferral.defer(fence, "throttle", get_settings()) == "deferred"
    page = run_page(run_id)
    (attempt,) = page.attempts
    assert attempt.state == "deferred" and attempt.deferral_cause == "throttle"
    assert attempt.next_retry_at is not None and attempt.next_retry_at > page.now
    assert [e.kind for e in attempt.timeline] == ["attempt.started", "run.deferred"]
    assert page.deferral_count == 1 and attempt.heartbeat_deadline is None


def test_sheet_rows_taken_over_by_a_newer_version_name_the_winner(org: str) -> None:
    older, newer = new_run(org), new_run(org)
    with session_scope() as session:
        sheet = store.ensure_sheet(session, org, "noop", "companies")
        v1 = store.resolve_stable_intent(session, sheet, older, 1, "companies", None).version
        store.admit_page(session, sheet, v1, [("a.com", {}), ("b.com", {})])
    with session_scope() as session:
        v2 = store.resolve_stable_intent(session, sheet, newer, 1, "companies", None).version
        store.admit_page(session, sheet, v2, [("a.com", {})])
    assert v2 > v1
    assert run_page(older).sheets == [
        SheetPanel("companies", v1, "stable", {"pending": 1}, [(v2, newer, 1)])]
    assert run_page(newer).sheets == [SheetPanel("companies", v2, "stable", {"pending": 1}, [])]


def test_steps_are_counted_and_a_long_ledger_is_paged(org: str) -> None:
    run_id = new_run(org)
    with session_scope() as session:
        session.add_all([RunEvent(run_id=run_id, kind=EventKind.STEP_REUSED, data={"key": "k"})
                         for _ in range(2)])
        session.add(RunEvent(run_id=run_id, kind=EventKind.STEP_COMPLETED, data={"key": "j"}))
        session.add_all([RunEvent(run_id=run_id, kind="run.progress",
                                  data={"message": f"m{i}", "fields": {}}) for i in range(247)])
    page = run_page(run_id)
    assert (page.steps.reused, page.steps.computed) == (2, 1)
    assert page.ledger.total == 251 and len(page.ledger.events) == 200
    assert page.ledger.events[0].kind == "run.admitted" and page.ledger.after is not None
    rest = run_page(run_id, after=page.ledger.after).ledger
    assert len(rest.events) == 51 and rest.after is None
    assert json.loads(rest.events[-1].data) == {"message": "m246", "fields": {}}
    seen = [e.id for e in page.ledger.events + rest.events]
    assert seen == sorted(set(seen))
    tail = run_page(run_id, tail=True).ledger
    assert [e.id for e in tail.events] == seen[-200:]


def test_failure_classes_and_unknown_runs() -> None:
    assert failure_class("PLAY_ERROR") is FailureClass.PLAY
    assert failure_class("START_DEFERRAL_EXHAUSTED") is FailureClass.BEFORE_CODE
    assert failure_class("RUNTIME_RUNNER_LOST") is FailureClass.RUNTIME
    assert failure_class("RUNTIME_SHEET_ATTEMPT_SUPERSEDED") is FailureClass.SHEET
    assert failure_class("CANCELLED") is FailureClass.CANCELLED
    assert failure_class("SOMETHING_NEW") is FailureClass.OTHER
    assert failure_class(None) is None
    with pytest.raises(RunNotFoundError):
        run_page("<script>")
