"""Stored states and kinds are StrEnums whose values are exactly what the database holds."""

from __future__ import annotations

import re
from enum import StrEnum

import sqlalchemy as sa

import tasks
from tasks.constants import (
    LEASE_HELD,
    RECEIPT_HELD,
    TERMINAL_EVENT,
    TERMINAL_STATUSES,
    AttemptState,
    EventKind,
    IntentKind,
    IntentStatus,
    LeaseState,
    PoolMemberState,
    ReceiptState,
    RunStatus,
    SandboxState,
    SheetRowStatus,
)

# What rows written by every release so far hold: a changed value would strand them.
STORED = {
    RunStatus: {"queued", "running", "succeeded", "failed", "cancelled"},
    AttemptState: {"active", "ended", "fenced_out", "deferred"},
    LeaseState: {"reserved", "live", "released"},
    SandboxState: {"live", "cleanup", "deleted"},
    ReceiptState: {"pending", "running", "completed", "failed", "released"},
    SheetRowStatus: {"pending", "done", "failed"},
    IntentKind: {"stable", "legacy"},
    IntentStatus: {"admitted"},
    PoolMemberState: {"creating", "ready", "claimed", "retiring", "gone"},
    EventKind: {
        "run.admitted",
        "attempt.started",
        "run.deferred",
        "sandbox.requested",
        "sandbox.live",
        "run.progress",
        "sandbox.deleted",
        "capacity.released",
        "capacity.overrun",
        "receipts.released",
        "step.reused",
        "step.completed",
        "step.failed",
        "step.taken_over",
        "run.cancel_requested",
        "run.maintenance_failed",
        "run.progress_dropped",
        "placement.chosen",
        "pool.claimed",
        "pool.missed",
        "ledger.budget_spent",
        "gateway.refused",
        "runner.lost",
        "runner.unreachable",
        "run.succeeded",
        "run.failed",
        "run.cancelled",
    },
}

# The column each enum is stored in.
COLUMNS: dict[type[StrEnum], tuple[str, str]] = {
    RunStatus: ("runs", "status"),
    AttemptState: ("attempts", "state"),
    LeaseState: ("capacity_leases", "state"),
    SandboxState: ("runtime_resources", "state"),
    SheetRowStatus: ("sheet_rows", "status"),
    PoolMemberState: ("pool_members", "state"),
}


def test_every_stored_value_is_unchanged() -> None:
    for enum, values in STORED.items():
        assert {m.value for m in enum} == values, enum.__name__


def test_members_are_the_plain_strings_sql_and_json_see() -> None:
    assert RunStatus.SUCCEEDED == "succeeded" and f"{RunStatus.SUCCEEDED}" == "succeeded"
    assert "succeeded" in TERMINAL_STATUSES and "queued" not in TERMINAL_STATUSES
    assert set(TERMINAL_STATUSES) == {"succeeded", "failed", "cancelled"}
    assert set(LEASE_HELD) == {"reserved", "live"}
    assert set(RECEIPT_HELD) == {"pending", "running"}
    assert {s.value: k.value for s, k in TERMINAL_EVENT.items()} == {
        "succeeded": "run.succeeded",
        "failed": "run.failed",
        "cancelled": "run.cancelled",
    }


def _literals(sql: str, column: str) -> set[str]:
    """The quoted values `column` is compared with (=, <>, IN) in one schema statement."""
    found: set[str] = set()
    for m in re.finditer(rf"\b{column}\s*(?:=|<>|IN)\s*\(?((?:'[^']*'(?:\s*,\s*)?)+)", sql):
        found.update(re.findall(r"'([^']*)'", m.group(1)))
    return found


def test_the_migrated_schema_names_only_enum_values(sqlite_db: str) -> None:
    """Partial indexes and CHECK constraints the migrations create use these values."""
    with sa.create_engine(sqlite_db).connect() as conn:
        schema = list(
            conn.execute(sa.text("SELECT tbl_name, sql FROM sqlite_master WHERE sql IS NOT NULL"))
        )
    for enum, (table, column) in COLUMNS.items():
        used = set().union(*(_literals(sql, column) for t, sql in schema if t == table))
        assert used, f"{table}.{column}: no literal found; the schema changed"
        assert used <= {m.value for m in enum}, f"{table}.{column}: {used}"
    check = next(sql for t, sql in schema if t == "sheet_rows" and "CHECK" in sql)
    assert _literals(check, "status") == {m.value for m in SheetRowStatus}


def test_the_package_exports_the_enums_users_compare_with() -> None:
    assert tasks.RunStatus is RunStatus and tasks.AttemptState is AttemptState
    assert tasks.EventKind is EventKind and tasks.ReceiptState is ReceiptState
    assert tasks.SheetRowStatus is SheetRowStatus
    assert {"RunStatus", "AttemptState", "EventKind", "RunRequest"} <= set(tasks.__all__)
