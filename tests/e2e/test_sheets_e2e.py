"""Runtime sheets end to end: plays in real sandboxes under a real worker fill sheets
through the gateway; a newer run supersedes an older one; app code and the CLI read them."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import tasks
from tests.support.helpers import eventually, kinds
from tests.support.paths import ROOT
from tests.support.sheets import PLAY_NAME, SHEET_PLAY, intents, new_org
from tests.support.stack import Worker, worker_env

pytestmark = pytest.mark.slow

ROWS = 5000
FAILING = {f"c{i:05d}.com" for i in range(0, ROWS, 1000)}  # five rows whose fn raises


def rows_of(n: int) -> list[dict[str, Any]]:
    return [{"domain": f"c{i:05d}.com", **({"fail": True} if f"c{i:05d}.com" in FAILING
                                            else {})} for i in range(n)][::-1]


def progress(run_id: str) -> list[tuple[Any, dict[str, Any]]]:
    return [(e.at, e.data["fields"]) for e in tasks.run_events(run_id)
            if e.kind == "run.progress" and e.data["message"].startswith("sheet ")]


@pytest.fixture(scope="module")
def filled(worker: Worker) -> Iterator[tuple[str, str, tasks.RunResult]]:
    org = new_org()
    handle = tasks.submit_run(SHEET_PLAY, input={"rows": rows_of(ROWS)}, org_id=org)
    yield org, handle.id, handle.wait(timeout=180)


def test_a_play_fills_a_5000_row_sheet_across_pages(
        filled: tuple[str, str, tasks.RunResult]) -> None:
    org, run_id, result = filled
    assert result.status == "succeeded", result.error
    version = result.output["write_version"]
    assert result.output == {"enriched": ROWS, "failed": len(FAILING), "write_version": version}
    rows = tasks.sheet_rows(org, PLAY_NAME, "companies")
    assert [r.key for r in rows] == sorted(f"c{i:05d}.com" for i in range(ROWS))
    assert {r.write_version for r in rows} == {version}
    assert {r.key for r in rows if r.status == "failed"} == FAILING
    assert all(r.status == "done" for r in rows if r.key not in FAILING)
    sample = rows[1]
    assert sample.data == {"domain": "c00001.com"}
    assert sample.result == {"domain": "c00001.com", "letters": 10, "by": run_id}
    assert rows[0].error == "ValueError: cannot enrich c00000.com" and rows[0].result is None
    assert intents(run_id) == [(version, "stable", "admitted")]  # one intent, ten pages
    # Progress: rows done of the total, in order, at most about once a second.
    seen = progress(run_id)
    assert seen[-1][1] == {"table": "companies", "done": ROWS, "total": ROWS}
    assert [f["done"] for _, f in seen] == sorted(f["done"] for _, f in seen)
    view = tasks.get_run(run_id)
    assert view.finished_at is not None
    span = (view.finished_at - view.attempts[0].started_at).total_seconds()
    assert len(seen) <= span + 2


def playrun(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**worker_env(), "COLUMNS": "200", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "tasks.cli.main", *args], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=120, check=False)


def test_sheet_show_counts_rows_by_status_and_version(
        filled: tuple[str, str, tasks.RunResult]) -> None:
    org, run_id, result = filled
    shown = playrun("sheet", "show", "companies", "--org", org, "--play", PLAY_NAME)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"sheet companies of play {PLAY_NAME}, org {org}: {ROWS} rows" in out
    # Piped: tab-separated rows, every id whole.
    assert re.search(r"^done\t4995$", out, re.M) and re.search(r"^failed\t5$", out, re.M)
    assert re.search(r"^pending\t0$", out, re.M)
    assert re.search(rf"^{result.output['write_version']}\t{run_id}\tstable\t{ROWS}$", out,
                     re.M)
    assert "c00000.com" in out and "ValueError: cannot enrich" in out
    missing = playrun("sheet", "show", "nope", "--org", org, "--play", PLAY_NAME)
    assert missing.returncode == 2
    assert missing.stderr.startswith("error SHEET_NOT_FOUND: no sheet 'nope'"), missing.stderr


def test_sheet_export_writes_csv_and_jsonl(filled: tuple[str, str, tasks.RunResult]) -> None:
    org, run_id, result = filled
    as_csv = playrun("sheet", "export", "companies", "--org", org, "--play", PLAY_NAME,
                     "--format", "csv")
    assert as_csv.returncode == 0, as_csv.stderr
    table = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert len(table) == ROWS
    assert list(table[0]) == ["key", "status", "write_version", "data", "result", "error",
                              "updated_at"]
    assert [r["key"] for r in table] == sorted(r["key"] for r in table)
    first, second = table[0], table[1]
    assert (first["status"], first["result"], first["error"]) == (
        "failed", "", "ValueError: cannot enrich c00000.com")
    assert json.loads(second["result"]) == {"domain": "c00001.com", "letters": 10,
                                            "by": run_id}
    assert json.loads(second["data"]) == {"domain": "c00001.com"}
    assert {r["write_version"] for r in table} == {str(result.output["write_version"])}
    as_jsonl = playrun("sheet", "export", "companies", "--org", org, "--play",
                       str(SHEET_PLAY.relative_to(ROOT)), "--format", "jsonl")
    assert as_jsonl.returncode == 0, as_jsonl.stderr
    lines = [json.loads(line) for line in as_jsonl.stdout.splitlines()]
    assert [r["key"] for r in lines] == [r["key"] for r in table]
    assert lines[1]["result"] == json.loads(second["result"]) and lines[1]["status"] == "done"
    bad = playrun("sheet", "export", "companies", "--org", org, "--play", PLAY_NAME,
                  "--format", "xml")
    assert bad.returncode != 0


def test_a_newer_run_supersedes_the_old_runs_late_writes(worker: Worker) -> None:
    org = new_org()
    rows = [{"domain": f"s{i:03d}.com"} for i in range(50)]
    old = tasks.submit_run(SHEET_PLAY, input={"rows": rows, "hold": "s010.com"}, org_id=org)
    # The old run has admitted its rows and holds one: now a newer run of the same play.
    eventually(lambda: any(e.kind == "run.progress" and e.data["message"] == "holding"
                           for e in tasks.run_events(old.id)), timeout=60,
               what="the old run to hold a row")
    new = tasks.submit_run(SHEET_PLAY, input={"rows": rows}, org_id=org)
    newer = new.wait(timeout=90)
    assert newer.status == "succeeded", newer.error
    stale = old.wait(timeout=90)
    assert (stale.status, stale.code) == ("failed", "RUNTIME_SHEET_ATTEMPT_SUPERSEDED")
    assert stale.error is not None
    assert "sheet 'companies'" in stale.error and f"from run {old.id}" in stale.error
    assert re.search(r"\(newer_write_version=\d+\)", stale.error)
    assert "Sample: key=s0" in stale.error
    v_old, v_new = intents(old.id)[0][0], intents(new.id)[0][0]
    assert v_new > v_old and newer.output["write_version"] == v_new
    assert f"row_write_version={v_new}" in stale.error
    final = tasks.sheet_rows(org, PLAY_NAME, "companies")
    assert len(final) == 50
    assert {(r.status, r.write_version, r.result["by"]) for r in final} == {
        ("done", v_new, new.id)}
    assert "run.failed" in kinds(old.id)
