"""Retention on PostgreSQL and SQLite: what an ended run left goes, oldest first and in
bounded batches; running and queued runs, and anything still held, stay; the export has
exactly the rows deleted; a dry run deletes nothing; beat's task and `playrun prune` run it."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from typer.main import get_command

from models import (
    Attempt,
    CapacityLease,
    EventDelivery,
    Outbox,
    PlayBundle,
    Run,
    RunEvent,
    RuntimeResource,
    Sheet,
    SheetRow,
    SheetWriteIntent,
    WorkReceipt,
    new_id,
)
from tasks.cli.main import app
from tasks.constants import MAINTENANCE_QUEUE, TASK_PRUNE_HISTORY
from tasks.maintenance.retention import TABLES, prune
from tasks.settings import reset_settings
from tasks.store.db import session_scope
from tests.support.helpers import eventually
from tests.support.stack import Worker

DAY = 86400.0
COMMAND = get_command(app)
OLD = datetime.now(UTC) - timedelta(days=40)
RECENT = datetime.now(UTC) - timedelta(days=1)


@pytest.fixture(params=["postgresql", "sqlite"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_db")


@dataclass
class History:
    """One org's runs: those retention must delete, and those it must keep."""

    org: str
    gone: list[str] = field(default_factory=list)  # ended long ago, nothing held
    kept: dict[str, str] = field(default_factory=dict)  # run id -> why it stays
    receipts_gone: list[str] = field(default_factory=list)
    receipts_kept: list[str] = field(default_factory=list)
    sheet_id: int = 0


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _receipt(session: Any, org: str, run_id: str, status: str, at: datetime) -> str:
    key = _key(f"{org}/{run_id}/{status}/{at}")
    session.add(WorkReceipt(
        receipt_key=key, org_id=org, play="p", step_key=f"s-{status}", status=status,
        owner_run_id=run_id, owner_generation=1, owner_launch_id=new_id(), claim_id="c",
        output=None, created_at=at, updated_at=at, claimed_at=at,
        completed_at=at if status == "completed" else None,
        released_at=at if status == "released" else None))
    return key


def _run(session: Any, org: str, digest: str, status: str, created: datetime,
         finished: datetime | None, *, attempt: str = "ended", sandbox: str = "deleted",
         lease: str = "released", sent: bool = True, sheet_id: int | None = None) -> str:
    run_id = new_id()
    session.add(Run(id=run_id, org_id=org, play_path="plays/p.py", play_digest=digest,
                    input={}, status=status, current_generation=1, deferral_count=0,
                    deferral_total_ms=0, created_at=created, updated_at=created,
                    finished_at=finished))
    session.flush()
    session.add_all([
        Attempt(id=new_id(), run_id=run_id, generation=1, lease_token="t",
                lease_expires_at=created, state=attempt, started_at=created,
                ended_at=finished),
        RuntimeResource(id=new_id(), run_id=run_id, generation=1, provider="fake",
                        sandbox_id=f"sb-{run_id}", labels={}, state=sandbox,
                        created_at=created, updated_at=created),
        CapacityLease(id=new_id(), org_id=org, run_id=run_id, generation=1, state=lease,
                      reserved_at=created),
        Outbox(id=str(uuid.uuid4()), run_id=run_id, task_name="playrun.start_attempt",
               args=[run_id], created_at=created, available_at=created,
               sent_at=created if sent else None, publish_count=1 if sent else 0),
        EventDelivery(run_id=run_id, idempotency_key="k", owner="o", count=2,
                      created_at=created),
        *(RunEvent(run_id=run_id, generation=1, kind="run.progress", data={"n": n},
                   at=created) for n in range(3)),
    ])
    if sheet_id is not None:
        session.add(SheetWriteIntent(sheet_id=sheet_id, version=1, run_id=run_id,
                                     generation=1, kind="map", status="done",
                                     intent_key=run_id, created_at=created))
    return run_id


def _history() -> History:
    org = f"ret-{uuid.uuid4().hex[:8]}"
    h = History(org)
    source = f"def run(ctx, input):\n    return {org!r}\n"
    digest = hashlib.sha256(source.encode()).hexdigest()
    with session_scope() as session:
        session.add(PlayBundle(digest=digest, source=source, size=len(source)))
        sheet = Sheet(org_id=org, play="p", name="t", last_version=1)
        session.add(sheet)
        session.flush()
        h.sheet_id = sheet.id
        session.add(SheetRow(sheet_id=sheet.id, key="a", data={}, status="done",
                             write_version=1))
        ended = [_run(session, org, digest, status, OLD, OLD + timedelta(minutes=i),
                      sheet_id=sheet.id if i == 0 else None)
                 for i, status in enumerate(["succeeded", "failed", "cancelled", "succeeded",
                                             "failed"])]
        h.gone = ended
        h.receipts_gone = [_receipt(session, org, ended[0], "released", OLD)]
        h.receipts_kept = [_receipt(session, org, ended[0], "completed", OLD),
                           _receipt(session, org, ended[1], "released", RECENT)]
        h.kept[_run(session, org, digest, "running", OLD, None, attempt="active",
                    sandbox="live", lease="live")] = "running"
        h.kept[_run(session, org, digest, "queued", OLD, None, attempt="deferred",
                    sandbox="deleted", sent=False)] = "queued"
        h.kept[_run(session, org, digest, "succeeded", RECENT, RECENT)] = "recent"
        h.kept[_run(session, org, digest, "failed", OLD, OLD, sandbox="cleanup")] = \
            "sandbox not yet deleted"
        held = _run(session, org, digest, "failed", OLD, OLD)
        h.receipts_kept.append(_receipt(session, org, held, "running", OLD))
        h.kept[held] = "holds a running receipt"
    return h


def _present(h: History) -> tuple[set[str], set[str], int]:
    runs = list(h.kept) + h.gone
    with session_scope(readonly=True) as session:
        found = set(session.scalars(sa.select(Run.id).where(Run.id.in_(runs))))
        receipts = set(session.scalars(sa.select(WorkReceipt.receipt_key).where(
            WorkReceipt.org_id == h.org)))
        rows = session.scalar(sa.select(sa.func.count()).select_from(SheetRow)
                              .where(SheetRow.sheet_id == h.sheet_id))
    return found, receipts, int(rows or 0)


def _children(run_ids: list[str]) -> dict[str, int]:
    counts = {}
    with session_scope(readonly=True) as session:
        for model in (RunEvent, EventDelivery, Attempt, Outbox, RuntimeResource,
                      CapacityLease, SheetWriteIntent):
            table = model.__table__
            assert isinstance(table, sa.Table)
            counts[table.name] = int(session.scalar(
                sa.select(sa.func.count()).select_from(table)
                .where(table.c.run_id.in_(run_ids))) or 0)
    return counts


def test_prune_deletes_only_ended_unheld_history_and_exports_each_deleted_row(
        backend: str, tmp_path: Path) -> None:
    h = _history()
    dry = prune(30 * DAY, batch=2, dry_run=True, export_dir=tmp_path / "dry")
    assert _present(h) == (set(h.kept) | set(h.gone),
                           set(h.receipts_gone) | set(h.receipts_kept), 1)
    assert dry.deleted["runs"] >= len(h.gone) and dry.deleted["run_events"] >= 15

    report = prune(30 * DAY, batch=2, export_dir=tmp_path / "out")
    runs, receipts, sheet_rows = _present(h)
    assert runs == set(h.kept), "kept: " + ", ".join(sorted(h.kept.values()))
    assert receipts == set(h.receipts_kept) and sheet_rows == 1
    assert set(_children(h.gone).values()) == {0}
    assert _children(list(h.kept))["run_events"] == 3 * len(h.kept)
    # Batches of two runs: five of this org's take three or more transactions.
    assert len(report.batch_ms) >= 3 and report.complete
    assert report.deleted == dry.deleted  # nothing else changed in between
    exported: dict[str, list[dict[str, Any]]] = {}
    for table in TABLES:
        path = tmp_path / "out" / f"{table}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        exported[table] = [json.loads(line) for line in lines]
        assert len(exported[table]) == report.deleted[table], table
    assert set(h.gone) <= {r["id"] for r in exported["runs"]}
    assert set(h.receipts_gone) <= {r["receipt_key"] for r in exported["work_receipts"]}
    mine = [r for r in exported["run_events"] if r["run_id"] in h.gone]
    assert sorted(r["data"]["n"] for r in mine) == sorted([0, 1, 2] * 5)
    assert [r["version"] for r in exported["sheet_write_intents"]
            if r["run_id"] == h.gone[0]] == [1]
    # What the dry run wrote is what the real one deleted, row for row.
    for table in TABLES:
        path = tmp_path / "dry" / f"{table}.jsonl"
        dry_rows = path.read_text().splitlines() if path.exists() else []
        assert sorted(dry_rows) == sorted(json.dumps(r, sort_keys=True, ensure_ascii=False)
                                          for r in exported[table]), table
    with session_scope(readonly=True) as session:  # the exported runs are gone
        assert session.scalar(sa.select(sa.func.count()).select_from(Run).where(
            Run.id.in_([r["id"] for r in exported["runs"]]))) == 0


def test_a_pass_takes_at_most_its_batches_oldest_first(backend: str) -> None:
    h = _history()
    report = prune(30 * DAY, batch=2, max_batches=1)
    assert len(report.batch_ms) == 1 and not report.complete
    assert report.deleted["runs"] <= 2
    runs, _, _ = _present(h)
    # Other tests' history may be older; what went of this org went oldest first.
    gone_here = [r for r in h.gone if r not in runs]
    assert gone_here == h.gone[:len(gone_here)]
    prune(30 * DAY, batch=2)
    assert _present(h)[0] == set(h.kept)


def test_beat_schedules_retention_and_its_task_prunes(sqlite_db: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.broker.app import app as celery_app
    from tasks.maintenance.schedule import CheckedScheduler
    from tasks.worker.jobs import prune_history

    h = _history()
    saved = celery_app.conf.beat_schedule
    try:
        CheckedScheduler(app=celery_app, lazy=True).setup_schedule()
        entry = celery_app.conf.beat_schedule["playrun-retention"]
    finally:
        celery_app.conf.beat_schedule = saved
    assert entry["task"] == TASK_PRUNE_HISTORY and entry["options"]["expires"] == 300.0
    result = prune_history()
    assert result["complete"] and result["deleted"]["runs"] == len(h.gone)
    assert _present(h)[0] == set(h.kept)
    monkeypatch.setenv("PLAYRUN_RETENTION_DAYS", "0")  # 0 keeps everything
    reset_settings()
    h2 = _history()
    assert prune_history()["batches"] == 0
    assert _present(h2)[0] == set(h2.kept) | set(h2.gone)


def test_playrun_prune_dry_run_export_and_coded_refusals(sqlite_db: str, tmp_path: Path
                                                         ) -> None:
    runner = CliRunner()
    h = _history()
    for bad in ("banana", "-5d", "0", "-1"):
        result = runner.invoke(COMMAND, ["prune", "--older-than", bad])
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert result.output.startswith("error DURATION_INVALID:"), result.output
    for bad in ("0", "many", "10001"):
        result = runner.invoke(COMMAND, ["prune", "--batch", bad])
        assert result.exit_code == 2 and result.output.startswith("error INPUT_INVALID:")
    blocked = tmp_path / "file"
    blocked.write_text("")
    result = runner.invoke(COMMAND, ["prune", "--export", str(blocked / "x")])
    assert result.exit_code == 2 and result.output.startswith("error PRUNE_EXPORT_FAILED:")
    dry = runner.invoke(COMMAND, ["prune", "--older-than", "30d", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["deleted"]["runs"] == len(h.gone)
    assert _present(h)[0] == set(h.kept) | set(h.gone)
    done = runner.invoke(COMMAND, ["prune", "--older-than", "30d", "--export",
                                   str(tmp_path / "x")])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["deleted"]["runs"] == len(h.gone)
    assert len((tmp_path / "x" / "runs.jsonl").read_text().splitlines()) == len(h.gone)
    assert _present(h)[0] == set(h.kept)


def test_a_worker_runs_beat_s_retention_task(pg_url: str, worker: Worker) -> None:
    """The task beat sends, run by a real worker (default retention: 30 days)."""
    import tasks

    h = _history()
    tasks.app.send_task(TASK_PRUNE_HISTORY, queue=MAINTENANCE_QUEUE)
    # Runs go first, then receipts, in later transactions of the same pass.
    want = (set(h.kept), set(h.receipts_kept))
    eventually(lambda: _present(h)[:2] == want or None, timeout=60)
    assert _present(h) == (*want, 1)
