"""Settlement of whatever the untrusted reader lets through, on real PostgreSQL (whose JSONB
refuses what SQLite keeps): every document ends in a stored terminal or a coded refusal."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tasks
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle
from tests.support.documents import JSONISH, RESULTS, check_settled, settle_document
from tests.support.runs import must_claim, new_run


@given(st.one_of(RESULTS, JSONISH))
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_result_document_settles_on_postgres(pg_url: str, raw: str) -> None:
    check_settled(raw, *settle_document(raw))


def test_an_outcome_the_database_refuses_is_settled_output_invalid(pg_url: str) -> None:
    fence = must_claim(new_run())
    # Bypassing the reader: PostgreSQL's JSONB refuses \u0000 inside a string.
    settled = settle(fence, Outcome("succeeded", output={"bad": "a\x00b"}), reason="ended")
    view = tasks.get_run(fence.run_id)
    assert settled.won
    assert (view.status, view.code, view.output) == ("failed", "OUTPUT_INVALID", None)
    assert "could not be stored" in (view.error or "")
