"""The sheet store on SQLite (the embedded default): the same statements, one writer."""

from __future__ import annotations

from pathlib import Path

import pytest

from models import PlayBundle, Run
from tasks.errors import SheetWriteVersionMismatchError
from tasks.sheets import store
from tasks.store import db
from tasks.store.db import session_scope


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'sheets.db'}"
    db.upgrade(url)
    with session_scope(url) as s:
        s.add(PlayBundle(digest="d" * 64, source="", size=0))
        s.flush()
        for run_id in ("a" * 32, "b" * 32):
            s.add(Run(id=run_id, org_id="acme", play_path="plays/enrich.py",
                      play_digest="d" * 64, status="running", current_generation=1))
    return url


def test_admission_writes_and_reads_on_sqlite(sqlite_url: str) -> None:
    old, new = "a" * 32, "b" * 32
    rows = [(f"k{i:03d}", {"domain": f"k{i:03d}", "n": i}) for i in range(300)][::-1]
    with session_scope(sqlite_url) as s:
        sheet = store.ensure_sheet(s, "acme", "enrich", "companies")
        v_old = store.resolve_stable_intent(s, sheet, old, 1, "companies", None).version
        first = store.admit_page(s, sheet, v_old, rows)
    assert len(first.todo) == 300
    with session_scope(sqlite_url) as s:
        again = store.resolve_stable_intent(s, sheet, old, 1, "companies", v_old)
        assert (again.version, again.minted) == (v_old, False)
        written, rejected = store.write_rows(s, sheet, v_old, [
            store.RowWrite("k001", "done", "1"), store.RowWrite("k002", "done", None),
            store.RowWrite("k003", "failed", error="no"), store.RowWrite("zzz", "done", 1)])
    assert written == ["k001", "k002", "k003"]
    assert rejected == [{"key": "zzz", "reason": "older_write_version", "write_version": None}]
    with session_scope(sqlite_url) as s:
        v_new = store.resolve_stable_intent(s, sheet, new, 1, "companies", None).version
        readmitted = store.admit_page(s, sheet, v_new, rows[-2:])  # k000, k001
        late, stale = store.write_rows(s, sheet, v_old, [store.RowWrite("k000", "done", 0),
                                                        store.RowWrite("k004", "done", 4)])
        with pytest.raises(SheetWriteVersionMismatchError):
            store.admitted_version(s, sheet, new, v_old, "companies")
    assert v_new > v_old and sorted(readmitted.todo) == ["k000", "k001"]
    assert late == ["k004"]
    assert stale == [{"key": "k000", "reason": "newer_write_version", "write_version": v_new}]
    with session_scope(sqlite_url) as s:
        page, after = store.read_rows(s, sheet, limit=5)
        picked, _ = store.read_rows(s, sheet, keys=["k002", "k003"])
    assert [r["key"] for r in page] == ["k000", "k001", "k002", "k003", "k004"]
    assert after == "k004"
    assert (page[1]["status"], page[1]["write_version"], page[1]["result"]) == (
        "pending", v_new, None)
    assert [(r["status"], r["result"], r["error"]) for r in picked] == [
        ("done", None, None), ("failed", None, "no")]
    assert page[4]["result"] == 4 and page[4]["data"] == {"domain": "k004", "n": 4}
