"""The play's side of runtime sheets (playrun_sheets.py) against a real gateway process:
paging, reuse under the write intent, lost answers, supersession, row errors, hostile
input caught before anything is sent, progress, and the runner's verdict."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

import tasks
from tasks.acquisition.sandbox import runner_files
from tasks.execution import runner_client, runner_sheets
from tasks.execution.launch import runner_env
from tasks.execution.runner_sheets import (
    RuntimeSheetAttemptSupersededError,
    RuntimeSheetStop,
)
from tasks.execution.runner_sheets import (
    Sheet as SheetClient,
)
from tasks.security import tokens
from tasks.settings import Settings
from tasks.store.fence import Fence
from tests.support.helpers import eventually
from tests.support.runs import close_open_runs, supersede
from tests.support.sheets import (
    ORG_PREFIX,
    PLAY_NAME,
    LossyProxy,
    PlayCtx,
    Stopped,
    db_rows,
    intents,
    launch,
    new_org,
    ok,
    page,
    start,
    write,
)
from tests.support.stack import Gateway

EXECUTION = Path(__file__).resolve().parents[2] / "tasks" / "execution"


@pytest.fixture(scope="module", autouse=True)
def _close_hand_driven_runs(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)


def rows_of(n: int, prefix: str = "c") -> list[dict[str, Any]]:
    return [{"domain": f"{prefix}{i:06d}.com", "n": i} for i in range(n)]


def enrich(row: dict[str, Any]) -> dict[str, Any]:
    return {"domain": row["domain"], "double": row["n"] * 2}


def test_map_fills_a_sheet_across_pages_in_row_order(gateway: Gateway) -> None:
    run = launch()
    ctx = PlayCtx(run, gateway.url)
    rows = rows_of(1234)[::-1]  # not in key order: results follow the rows
    called: list[str] = []

    def fn(row: dict[str, Any]) -> dict[str, Any]:
        called.append(row["domain"])
        return enrich(row)

    sheet = SheetClient(ctx, "companies", page_rows=100, write_rows=50)
    results = sheet.map(rows, fn, key="domain")
    assert results == [enrich(r) for r in rows] and results.errors == {}
    assert called == [r["domain"] for r in rows]  # once per row
    starts = ctx.actions("sheet_start_with_intent")
    assert len(starts) == 13 and max(c["rows"] for c in starts) == 100
    assert len(ctx.actions("sheet_write")) == 25
    assert not ctx.actions("sheet_start")
    assert intents(run.run_id) == [(sheet.write_version, "stable", "admitted")]
    stored = db_rows(run.org_id)
    assert len(stored) == 1234
    assert {(s, v) for s, v, _ in stored.values()} == {("done", sheet.write_version)}
    assert stored["c000007.com"][2] == {"domain": "c000007.com", "double": 14}


def test_a_wake_of_the_same_run_reuses_its_intent_and_done_rows(gateway: Gateway) -> None:
    run = launch()
    rows = rows_of(30)
    first = SheetClient(PlayCtx(run, gateway.url), "companies", page_rows=7)
    first.map(rows[:20], enrich, key="domain")
    # A wake: all runner-local state lost, the same rows and more handed to map again.
    called: list[str] = []
    ctx = PlayCtx(run, gateway.url)
    woken = SheetClient(ctx, "companies", page_rows=7)
    results = woken.map(rows, lambda r: called.append(r["domain"]) or enrich(r), key="domain")
    assert woken.write_version == first.write_version
    assert called == [r["domain"] for r in rows[20:]]
    assert results == [enrich(r) for r in rows]
    assert len(intents(run.run_id)) == 1


def test_a_wake_reads_back_outcomes_too_large_for_the_admission_answer(
        gateway: Gateway) -> None:
    run = launch()
    rows = rows_of(40)

    def big(row: dict[str, Any]) -> str:
        return f"{row['n']}:" + "x" * 60_000  # 40 results of 60 kB: more than one answer

    SheetClient(PlayCtx(run, gateway.url), "companies").map(rows, big, key="domain")
    ctx = PlayCtx(run, gateway.url)
    woken = SheetClient(ctx, "companies").map(rows, lambda r: pytest.fail("re-done"),
                                              key="domain")
    assert woken == [big(r) for r in rows]
    assert ctx.actions("sheet_read") and not ctx.actions("sheet_write")


def test_a_lost_admission_answer_is_retried_under_the_same_version(gateway: Gateway) -> None:
    run = launch()
    proxy = LossyProxy(gateway.url, "sheet_start_with_intent", drop=2)
    try:
        ctx = PlayCtx(run, proxy.url)
        sheet = SheetClient(ctx, "companies", page_rows=10)
        results = sheet.map(rows_of(25), enrich, key="domain")
    finally:
        proxy.close()
    assert results == [enrich(r) for r in rows_of(25)]
    assert proxy.seen[:3] == [("sheet_start_with_intent", True)] * 2 + [
        ("sheet_start_with_intent", False)]
    # The server committed both lost admissions; the retry found the stored intent.
    assert intents(run.run_id) == [(sheet.write_version, "stable", "admitted")]
    assert {v for _, v, _ in db_rows(run.org_id).values()} == {sheet.write_version}


def test_a_lost_legacy_answer_is_why_the_runner_never_uses_it(gateway: Gateway) -> None:
    run = launch()
    proxy = LossyProxy(gateway.url, "sheet_start", drop=1)
    try:
        with pytest.raises(httpx.HTTPError):  # the answer never arrives
            start(proxy.url, run, page("a.com"), action="sheet_start")
        retry = ok(start(proxy.url, run, page("a.com"), action="sheet_start"))
    finally:
        proxy.close()
    minted = intents(run.run_id)
    assert len(minted) == 2 and retry["write_version"] == minted[-1][0] > minted[0][0]


class RecordingGateway:
    """Answers like the gateway (every row admitted, every write taken) and records what
    it was sent: the client's paging at a scale the database tests do not need."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, int, int]] = []  # (action, rows, bytes)

    def call(self, _token: str, body: dict[str, Any]) -> Any:
        self.requests.append((body["action"], len(body["rows"]), len(json.dumps(body))))
        keys = [r["key"] for r in body["rows"]]
        if body["action"] == "sheet_start_with_intent":
            return {"write_version": 1, "todo": keys, "done": [], "superseded": []}
        return {"written": len(keys), "rejected": []}


def test_100k_rows_in_one_call_go_in_pages_not_one_request() -> None:
    gateway = RecordingGateway()
    ctx = SimpleNamespace(_uplink=SimpleNamespace(gateway=gateway, token="t"), halted=None,
                          log=lambda *_a, **_k: None, run_id="r")
    results = SheetClient(ctx, "big").map(rows_of(100_000), lambda r: r["n"], key="domain")
    assert results == list(range(100_000))
    starts = [r for r in gateway.requests if r[0] == "sheet_start_with_intent"]
    writes = [r for r in gateway.requests if r[0] == "sheet_write"]
    assert len(starts) == math.ceil(100_000 / runner_sheets.PAGE_ROWS)
    assert {r[1] for r in starts} == {runner_sheets.PAGE_ROWS}
    assert sum(r[1] for r in writes) == 100_000
    assert max(r[1] for r in writes) == runner_sheets.WRITE_ROWS
    assert max(r[2] for r in gateway.requests) < runner_sheets.MAX_REQUEST_BYTES
    assert "sheet_start" not in {r[0] for r in gateway.requests}


def test_wide_rows_are_paged_by_bytes_as_well() -> None:
    gateway = RecordingGateway()
    ctx = SimpleNamespace(_uplink=SimpleNamespace(gateway=gateway, token="t"), halted=None,
                          log=lambda *_a, **_k: None, run_id="r")
    rows = [{"domain": f"w{i}", "blob": "x" * 60_000} for i in range(100)]
    SheetClient(ctx, "wide").map(rows, lambda r: len(r["blob"]), key="domain")
    starts = [r for r in gateway.requests if r[0] == "sheet_start_with_intent"]
    assert len(starts) > 5 and max(r[2] for r in starts) < runner_sheets.MAX_REQUEST_BYTES


class Odd:
    pass


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("rows", "error", "match"), [
    ([1, 2], TypeError, "row 0 is int, not an object"),
    ([{"domain": "a"}, ["b"]], TypeError, "row 1 is list"),
    ([{"domain": "a"}, {"name": "b"}], ValueError, "row 1 has no key field 'domain'"),
    ([{"domain": None}], TypeError, "must be a string or an integer"),
    ([{"domain": 1.5}], TypeError, "must be a string or an integer"),
    ([{"domain": ""}], ValueError, "empty"),
    ([{"domain": "k" * 10_000}], ValueError, "10000 bytes; the limit is 1024"),
    ([{"domain": "a"}] + [{"domain": f"x{i}"} for i in range(600)] + [{"domain": "a"}],
     ValueError, "appears in rows 0 and 601"),
    ([{"domain": "a", "when": Odd()}], TypeError, "row 0 is not JSON"),
    ([{"domain": "a", "x": float("nan")}], TypeError, "row 0 is not JSON"),
    ([{"domain": "a", "blob": "x" * 70_000}], ValueError, "the limit is 65536"),
    ([{"domain": "a", "big": 2**70}], ValueError, "beyond 64 bits"),
])
def test_bad_rows_are_refused_before_anything_is_sent(
        gateway: Gateway, rows: list[Any], error: type[Exception], match: str) -> None:
    ctx = PlayCtx(launch(), gateway.url)
    with pytest.raises(error, match=match):
        SheetClient(ctx, "companies").map(rows, enrich, key="domain")
    assert ctx.calls == []


@pytest.mark.parametrize("table", ["", "a b", "../x", "t;", "é", "t" * 65, None, 5])
def test_bad_table_names_are_refused(gateway: Gateway, table: Any) -> None:
    with pytest.raises(ValueError, match="table name"):
        SheetClient(PlayCtx(launch(), gateway.url), table)


def test_results_that_are_not_json_and_raising_rows_fail_only_their_row(
        gateway: Gateway) -> None:
    run = launch()
    outcomes: dict[str, Any] = {
        "set.com": {1, 2}, "nan.com": float("nan"), "big.com": "x" * 70_000,
        "deep.com": nested(70),
        "tuple.com": (1, "two"), "none.com": None,
    }

    def fn(row: dict[str, Any]) -> Any:
        if row["domain"] == "raise.com":
            raise LookupError("no such company")
        return outcomes[row["domain"]]

    rows = [{"domain": d} for d in [*outcomes, "raise.com"]]
    results = SheetClient(PlayCtx(run, gateway.url), "companies").map(rows, fn, key="domain")
    assert results == [None, None, None, None, [1, "two"], None, None]
    assert set(results.errors) == {"set.com", "nan.com", "big.com", "deep.com", "raise.com"}
    assert "not JSON" in results.errors["set.com"] and "not JSON" in results.errors["nan.com"]
    assert "the limit is 65536" in results.errors["big.com"]
    assert "deeper than" in results.errors["deep.com"]
    assert results.errors["raise.com"] == "LookupError: no such company"
    stored = {r.key: r for r in tasks.sheet_rows(run.org_id, PLAY_NAME, "companies")}
    assert stored["raise.com"].status == "failed"
    assert stored["raise.com"].error == "LookupError: no such company"
    assert (stored["tuple.com"].status, stored["tuple.com"].result) == ("done", [1, "two"])
    assert (stored["none.com"].status, stored["none.com"].result) == ("done", None)


def test_a_superseded_writer_stops_and_says_why(gateway: Gateway) -> None:
    org = new_org()
    old, new = launch(org), launch(org)
    rows = rows_of(8)
    ctx = PlayCtx(old, gateway.url)
    sheet = SheetClient(ctx, "companies", page_rows=100)

    def fn(row: dict[str, Any]) -> Any:
        if row["n"] == 7:  # meanwhile a newer run admits and finishes the same rows
            SheetClient(PlayCtx(new, gateway.url), "companies").map(rows, enrich, key="domain")
        return {"stale": True}

    with pytest.raises(RuntimeSheetAttemptSupersededError) as err:
        sheet.map(rows, fn, key="domain")
    message = str(err.value)
    assert "'companies'" in message and "rejected 8 of 8 row write(s)" in message
    assert "newer_write_version=8" in message and message.count("key=c0000") == 5
    assert err.value.table == "companies" and len(err.value.superseded_rows) == 8
    assert ctx.halted is not None and ctx.halted[0] == "RUNTIME_SHEET_ATTEMPT_SUPERSEDED"
    # Every later sheet call of the stopped run refuses at once, without the gateway.
    sent = len(ctx.calls)
    with pytest.raises(RuntimeSheetStop):
        sheet.map(rows_of(1, "z"), enrich, key="domain")
    assert len(ctx.calls) == sent
    stored = db_rows(org)
    assert all(r[0] == "done" and r[2] != {"stale": True} for r in stored.values())


def test_a_run_that_lost_its_fence_stops_the_runner(gateway: Gateway) -> None:
    run = launch()

    def fn(row: dict[str, Any]) -> Any:
        supersede(run.run_id)  # the attempt is fenced out while the play runs
        return 1

    with pytest.raises(Stopped, match="FENCE_LOST"):
        SheetClient(PlayCtx(run, gateway.url), "companies").map(rows_of(3), fn, key="domain")
    assert {r[0] for r in db_rows(run.org_id).values()} == {"pending"}


def test_map_reports_progress_at_most_once_a_second(gateway: Gateway) -> None:
    ctx = PlayCtx(launch(), gateway.url)
    started = time.monotonic()

    def slow(row: dict[str, Any]) -> int:
        time.sleep(0.01)  # work the play does per row
        return int(row["n"])

    SheetClient(ctx, "companies", page_rows=50).map(rows_of(300), slow, key="domain")
    elapsed = time.monotonic() - started
    assert ctx.logs[-1][2] == {"table": "companies", "done": 300, "total": 300}
    assert ctx.logs[-1][1] == "sheet companies: 300/300 rows"
    assert 2 <= len(ctx.logs) <= elapsed + 1
    gaps = [b[0] - a[0] for a, b in zip(ctx.logs[:-1], ctx.logs[1:-1], strict=False)]
    assert all(g >= 1.0 for g in gaps), gaps
    assert [f["done"] for _, _, f in ctx.logs] == sorted(f["done"] for _, _, f in ctx.logs)


def test_rows_reads_back_what_the_sheet_holds(gateway: Gateway) -> None:
    run = launch()
    sheet = SheetClient(PlayCtx(run, gateway.url), "companies")
    sheet.map(rows_of(1200), enrich, key="domain")
    everything = sheet.rows()
    assert [r["key"] for r in everything] == [r["domain"] for r in rows_of(1200)]
    picked = sheet.rows(keys=["c000003.com", "missing"])
    assert [(r["key"], r["status"], r["result"]) for r in picked] == [
        ("c000003.com", "done", {"domain": "c000003.com", "double": 6})]


# --- the runner's verdict ---------------------------------------------------------------

SWALLOWS = '''
import time

def run(ctx, input):
    sheet = ctx.sheet("companies")

    def fn(row):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = sheet.rows(keys=[row["domain"]])
            if got and got[0]["write_version"] > sheet.write_version:
                break
            time.sleep(0.05)
        return {"late": True}

    try:
        sheet.map([{"domain": "a.com"}, {"domain": "b.com"}], fn, key="domain")
    except Exception as exc:
        caught = type(exc).__name__
    try:
        sheet.map([{"domain": "c.com"}], fn, key="domain")
    except Exception as exc:
        later = str(exc)
    return {"caught": caught, "later": later}
'''


def runner_dir(tmp_path: Path, source: str) -> Path:
    for name, data in runner_files().items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "play.py").write_text(source)
    (tmp_path / "input.json").write_text("{}")
    return tmp_path


def test_a_play_that_swallows_the_supersession_still_fails_with_its_code(
        gateway: Gateway, tmp_path: Path) -> None:
    org = new_org()
    old = launch(org)
    env = {"PATH": "/usr/bin:/bin", "PLAYRUN_TOKEN": old.token(),
           "PLAYRUN_PROJECTION_TOKEN": old.token(tokens.PROJECTION_CAPABILITIES),
           "PLAYRUN_GATEWAY_URL": gateway.url, "PLAYRUN_LAUNCH_ID": old.launch_id,
           "PLAYRUN_HEARTBEAT_S": "1", "PLAYRUN_RUN_ID": old.run_id}
    proc = subprocess.Popen([sys.executable, "-s", "-E", "-B", "runner.py", "--timeout", "60"],
                            cwd=runner_dir(tmp_path, SWALLOWS), env=env)
    try:
        eventually(lambda: len(db_rows(org)) == 2, what="the old run's admission")
        new = launch(org)
        version = ok(start(gateway.url, new, page("a.com", "b.com")))["write_version"]
        ok(write(gateway.url, new, version, [
            {"key": k, "status": "done", "result": {"new": True}} for k in ("a.com", "b.com")]))
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["status"], result["code"]) == ("failed", "RUNTIME_SHEET_ATTEMPT_SUPERSEDED")
    assert "'companies'" in result["error"]
    assert re.search(r"\(newer_write_version=[12]\)", result["error"]), result["error"]
    view = tasks.get_run(old.run_id)  # pushed through the gateway and settled as such
    assert (view.status, view.code) == ("failed", "RUNTIME_SHEET_ATTEMPT_SUPERSEDED")
    assert {r[2]["new"] for r in db_rows(org).values()} == {True}
    assert "c.com" not in db_rows(org)


def test_a_runner_without_a_gateway_cannot_use_sheets(tmp_path: Path) -> None:
    source = "def run(ctx, input):\n    return ctx.sheet('t').map([{'k': 1}], str, key='k')\n"
    proc = subprocess.run([sys.executable, "-s", "-E", "-B", "runner.py", "--timeout", "10"],
                          cwd=runner_dir(tmp_path, source), env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["status"], result["code"]) == ("failed", "PLAY_ERROR")
    assert "runtime sheets need the gateway" in result["error"]


def test_page_and_write_sizes_are_settings_handed_to_the_runner(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert (Settings().sheet_page_rows, Settings().sheet_write_rows) == (500, 200)
    monkeypatch.setenv("PLAYRUN_SHEET_PAGE_ROWS", "50")
    monkeypatch.setenv("PLAYRUN_SHEET_WRITE_ROWS", "20")
    settings = Settings()
    env = runner_env(Fence("r", 1, "t"), "acme", "l", settings)
    assert (env["PLAYRUN_SHEET_PAGE_ROWS"], env["PLAYRUN_SHEET_WRITE_ROWS"]) == ("50", "20")
    monkeypatch.setattr(os, "environ", {**os.environ, **env})
    uplink = runner_client.Uplink.from_env(print)
    assert uplink is not None and not any(k.startswith("PLAYRUN_SHEET") for k in os.environ)
    sheet = SheetClient(SimpleNamespace(_uplink=uplink), "t")
    assert (sheet.page_rows, sheet.write_rows) == (50, 20)
    assert SheetClient(SimpleNamespace(), "t").page_rows == runner_sheets.PAGE_ROWS
    monkeypatch.setenv("PLAYRUN_SHEET_PAGE_ROWS", "5000")
    with pytest.raises(ValueError, match="sheet_page_rows"):
        Settings()
