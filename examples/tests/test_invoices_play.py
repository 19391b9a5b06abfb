"""The invoices play on a real stack: its rate lookup is a work receipt kept across runs,
while its sheet rows are computed again by every run (under that run's write version)."""

import uuid
from pathlib import Path

import tasks
from tasks.testing import Stack

pytest_plugins = ["tasks.testing.pytest_plugin"]

INVOICES = Path(__file__).resolve().parents[1] / "plays" / "invoices.py"
INPUT = {"month": "2026-12", "invoices": [
    {"id": "A-1", "amount": 100.0, "currency": "USD"},
    {"id": "A-2", "amount": 50.0, "currency": "EUR"},
    {"id": "A-3", "amount": 10.0, "currency": "JPY"},
]}


def _kinds(stack: Stack, run_id: str) -> list[str]:
    return [event.kind for event in stack.events(run_id)]


def test_invoices_prices_rows_and_reuses_the_rate_lookup(playrun_stack: Stack) -> None:
    org = f"acme-{uuid.uuid4().hex[:8]}"  # receipts and sheets are per org: start clean

    first = playrun_stack.run(INVOICES, INPUT, org_id=org)
    assert first.status == "succeeded", first.error
    assert first.output == {"month": "2026-12", "total_eur": 142.0, "failed": ["A-3"]}
    assert "step.completed" in _kinds(playrun_stack, first.id)

    rows = {row.key: row for row in tasks.sheet_rows(org, "invoices", "invoices")}
    assert {key: row.status for key, row in rows.items()} == {
        "A-1": "done", "A-2": "done", "A-3": "failed"}
    assert rows["A-1"].result == {"eur": 92.0}
    assert "no rate for JPY" in (rows["A-3"].error or "")

    second = playrun_stack.run(INVOICES, INPUT, org_id=org)
    assert second.status == "succeeded", second.error
    kinds = _kinds(playrun_stack, second.id)
    assert "step.reused" in kinds and "step.completed" not in kinds
    again = {row.key: row for row in tasks.sheet_rows(org, "invoices", "invoices")}
    assert all(row.write_version > rows[key].write_version for key, row in again.items())
    assert again["A-2"].result == {"eur": 50.0}
