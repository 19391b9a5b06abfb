"""Runtime sheet actions through a real gateway process on PostgreSQL: write intents that
survive pages and retries, legacy starts that do not, fenced row writes with reasons,
validation that refuses instead of overwriting, and hostile input."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from models import Sheet, SheetRow, SheetWriteIntent
from tasks.execution import runner_client
from tasks.security import tokens
from tasks.sheets import store
from tasks.store.db import session_scope
from tests.support.runs import close_open_runs, new_run, supersede
from tests.support.sheets import (
    ORG_PREFIX,
    PLAY_NAME,
    Launched,
    call,
    db_rows,
    done,
    intents,
    launch,
    new_org,
    ok,
    page,
    refused,
    start,
    write,
)
from tests.support.stack import Gateway


@pytest.fixture(scope="module", autouse=True)
def _close_hand_driven_runs(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)


def test_the_intent_start_stores_one_version_reused_by_pages_and_retries(
        gateway: Gateway) -> None:
    run = launch()
    first = ok(start(gateway.url, run, page("a.com", "b.com")))
    version = first["write_version"]
    assert sorted(first["todo"]) == ["a.com", "b.com"] and first["superseded"] == []
    # The next page names the version; a retried first page (answer lost) does not.
    second = ok(start(gateway.url, run, page("c.com"), version=version))
    retried = ok(start(gateway.url, run, page("a.com", "b.com")))
    assert second["write_version"] == retried["write_version"] == version
    assert sorted(retried["todo"]) == ["a.com", "b.com"]  # admitted, not yet written
    assert intents(run.run_id) == [(version, "stable", "admitted")]
    assert {k: v[:2] for k, v in db_rows(run.org_id).items()} == {
        "a.com": ("pending", version), "b.com": ("pending", version),
        "c.com": ("pending", version)}


def test_rows_written_under_the_intent_come_back_done_on_a_later_admission(
        gateway: Gateway) -> None:
    run = launch()
    version = ok(start(gateway.url, run, page("a.com", "b.com", "c.com")))["write_version"]
    answer = ok(write(gateway.url, run, version, [
        {"key": "a.com", "status": "done", "result": {"n": 1}},
        {"key": "b.com", "status": "failed", "error": "ValueError: no"}]))
    assert (answer["written"], answer["rejected"]) == (2, [])
    again = ok(start(gateway.url, run, page("a.com", "b.com", "c.com"), version=version))
    assert again["todo"] == ["c.com"]
    assert again["done"] == [{"key": "a.com", "status": "done", "result": {"n": 1}},
                             {"key": "b.com", "status": "failed", "error": "ValueError: no"}]
    # Writing the same rows again (a retried write) changes nothing and is benign.
    replay = ok(write(gateway.url, run, version, [
        {"key": "a.com", "status": "done", "result": {"n": 2}}]))
    assert replay["written"] == 0
    assert replay["rejected"] == [{"key": "a.com", "reason": "already_terminal",
                                   "write_version": version}]
    assert db_rows(run.org_id)["a.com"] == ("done", version, {"n": 1})


def test_the_legacy_start_mints_a_new_version_on_every_call(gateway: Gateway) -> None:
    run = launch()
    v1 = ok(start(gateway.url, run, page("a.com"), action="sheet_start"))["write_version"]
    v2 = ok(start(gateway.url, run, page("a.com"), action="sheet_start"))["write_version"]
    assert v2 > v1  # the retried page re-admitted its rows under a newer version
    v2_again = ok(start(gateway.url, run, page("b.com"), version=v2,
                        action="sheet_start"))["write_version"]
    assert v2_again == v2
    stale = ok(write(gateway.url, run, v1, done("a.com")))
    assert stale["rejected"] == [{"key": "a.com", "reason": "newer_write_version",
                                  "write_version": v2}]
    assert [i[1] for i in intents(run.run_id)] == ["legacy", "legacy"]


def test_a_newer_run_readmits_rows_and_the_old_runs_writes_are_rejected(
        gateway: Gateway) -> None:
    org = new_org()
    old = launch(org)
    v_old = ok(start(gateway.url, old, page("a.com", "b.com", "c.com")))["write_version"]
    ok(write(gateway.url, old, v_old, done("a.com")))
    new = launch(org)
    answer = ok(start(gateway.url, new, page("a.com", "b.com")))
    v_new = answer["write_version"]
    assert v_new > v_old
    assert sorted(answer["todo"]) == ["a.com", "b.com"]  # a.com is re-done by the new run
    assert db_rows(org)["a.com"] == ("pending", v_new, None)
    late = ok(write(gateway.url, old, v_old, done("b.com", "c.com", "zzz.com")))
    assert late["written"] == 1  # c.com is still the old run's
    assert late["rejected"] == [
        {"key": "b.com", "reason": "newer_write_version", "write_version": v_new},
        {"key": "zzz.com", "reason": "older_write_version", "write_version": None}]
    # The old run's next page meets rows the new run owns: it is told, nothing changes.
    later = ok(start(gateway.url, old, page("a.com", "d.com"), version=v_old))
    assert later["superseded"] == [{"key": "a.com", "reason": "newer_write_version",
                                    "write_version": v_new}]
    assert later["todo"] == ["d.com"]
    rows = db_rows(org)
    assert rows["a.com"][:2] == ("pending", v_new) and rows["c.com"][:2] == ("done", v_old)
    # The newer run's writer carrying the older version is refused, not merged.
    refused(write(gateway.url, new, v_old, done("a.com")), 409,
            "RUNTIME_SHEET_WRITE_VERSION_MISMATCH")


def _corrupt(run: Launched, **values: Any) -> None:
    with session_scope() as s:
        s.execute(sa.update(SheetWriteIntent).where(SheetWriteIntent.run_id == run.run_id)
                  .values(**values))


@pytest.mark.parametrize("corruption", ["run", "status", "kind"])
def test_a_stored_intent_that_is_not_this_runs_admitted_one_is_an_error(
        gateway: Gateway, corruption: str) -> None:
    run = launch()
    ok(start(gateway.url, run, page("a.com")))
    if corruption == "run":
        other = launch()
        _corrupt(run, run_id=other.run_id)
    elif corruption == "status":
        _corrupt(run, status="retired")
    else:
        _corrupt(run, kind="legacy")
    before = db_rows(run.org_id)
    error = refused(start(gateway.url, run, page("a.com", "b.com")), 409,
                    "RUNTIME_SHEET_WRITE_INTENT_INVALID")
    assert "companies" in error
    assert db_rows(run.org_id) == before  # nothing admitted: never a silent overwrite


def test_a_caller_version_that_disagrees_with_the_stored_intent_is_an_error(
        gateway: Gateway) -> None:
    run = launch()
    version = ok(start(gateway.url, run, page("a.com")))["write_version"]
    error = refused(start(gateway.url, run, page("b.com"), version=version + 1), 409,
                    "RUNTIME_SHEET_WRITE_VERSION_MISMATCH")
    assert str(version) in error
    # And a first admission that brings a version of its own is refused the same way.
    fresh = launch()
    refused(start(gateway.url, fresh, page("a.com"), version=7), 409,
            "RUNTIME_SHEET_WRITE_VERSION_MISMATCH")
    assert intents(fresh.run_id) == []
    assert set(db_rows(run.org_id)) == {"a.com"}


def test_a_write_with_a_version_the_run_never_admitted_is_refused(gateway: Gateway) -> None:
    org = new_org()
    run = launch(org)
    version = ok(start(gateway.url, run, page("a.com")))["write_version"]
    error = refused(write(gateway.url, run, version + 100, done("a.com")), 409,
                    "RUNTIME_SHEET_WRITE_VERSION_MISMATCH")
    assert "never admitted" in error
    # Another run's version is not this run's to write with, even for its rows.
    other = launch(org)
    refused(write(gateway.url, other, version, done("a.com")), 409,
            "RUNTIME_SHEET_WRITE_VERSION_MISMATCH")
    refused(write(gateway.url, run, version, done("a.com"), table="elsewhere"), 409,
            "RUNTIME_SHEET_WRITE_VERSION_MISMATCH")
    assert db_rows(org)["a.com"] == ("pending", version, None)


def test_a_write_after_the_fence_was_lost_changes_nothing(gateway: Gateway) -> None:
    run = launch()
    version = ok(start(gateway.url, run, page("a.com")))["write_version"]
    supersede(run.run_id)
    refused(write(gateway.url, run, version, done("a.com")), 409, "FENCE_LOST")
    refused(start(gateway.url, run, page("b.com")), 409, "FENCE_LOST")
    refused(call(gateway.url, run.token(), {"action": "sheet_read", "table": "companies"}),
            409, "FENCE_LOST")
    assert db_rows(run.org_id) == {"a.com": ("pending", version, None)}


def test_sheet_actions_need_their_capability(gateway: Gateway) -> None:
    run = launch()
    reader = run.token((tokens.SHEET_READ,))
    for body in ({"action": "sheet_start_with_intent", "table": "t", "rows": []},
                 {"action": "sheet_start", "table": "t", "rows": []},
                 {"action": "sheet_write", "table": "t", "write_version": 1,
                  "rows": done("a")}):
        refused(call(gateway.url, reader, body), 403, "GATEWAY_CAPABILITY_DENIED")
    assert intents(run.run_id) == []
    read = call(gateway.url, reader, {"action": "sheet_read", "table": "t"})
    assert ok(read) == {"table": "t", "rows": [], "next": None}
    writer = run.token((tokens.SHEET_WRITE,))
    refused(call(gateway.url, writer, {"action": "sheet_read", "table": "t"}), 403,
            "GATEWAY_CAPABILITY_DENIED")
    refused(call(gateway.url, run.token(tokens.PROJECTION_CAPABILITIES),
                 {"action": "sheet_start_with_intent", "table": "t", "rows": []}),
            403, "GATEWAY_CAPABILITY_DENIED")


def test_reads_page_through_rows_in_key_order(gateway: Gateway) -> None:
    run = launch()
    keys = [f"k{i:03d}" for i in range(25)] + ["Z", "é", "a"]
    version = ok(start(gateway.url, run, page(*keys)))["write_version"]
    ok(write(gateway.url, run, version, done("a")))
    seen: list[dict[str, Any]] = []
    after = None
    while True:
        answer = ok(call(gateway.url, run.token(), {"action": "sheet_read", "table": "companies",
                                                    "after": after, "limit": 10}))
        seen.extend(answer["rows"])
        after = answer["next"]
        if after is None:
            break
    assert [r["key"] for r in seen] == sorted(keys)  # code point order, as Python sorts
    assert {r["key"]: r for r in seen}["a"] == {
        "key": "a", "status": "done", "write_version": version, "data": {"domain": "a"},
        "result": {"k": "a"}, "error": None}
    picked = ok(call(gateway.url, run.token(), {"action": "sheet_read", "table": "companies",
                                                "keys": ["k001", "nope"]}))
    assert [r["key"] for r in picked["rows"]] == ["k001"]


def _body(action: str = "sheet_start_with_intent", **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"action": action, "table": "companies", "rows": page("a.com")}
    body.update(fields)
    return body


BAD_STARTS = {
    "a row that is not an object": _body(rows=[1]),
    "row data that is not an object": _body(rows=[{"key": "a", "data": [1, 2]}]),
    "a row without its key": _body(rows=[{"data": {"domain": "a"}}]),
    "a key that is not text": _body(rows=[{"key": 5, "data": {}}]),
    "an empty key": _body(rows=[{"key": "", "data": {}}]),
    "a key duplicated in the page": _body(rows=page("a.com", "b.com", "a.com")),
    "a key of 10 kB": _body(rows=page("k" * 10_000)),
    "a page over the row limit": _body(rows=page(*[f"k{i}" for i in range(2001)])),
    "a row over the byte limit": _body(rows=page("a.com", blob="x" * 70_000)),
    "an empty table name": _body(table=""),
    "a table name with a slash": _body(table="../etc"),
    "a table name with a space": _body(table="my table"),
    "a table name with a quote": _body(table="t'; drop table sheets; --"),
    "a table name with non-ASCII": _body(table="tablé"),
    "a table name too long": _body(table="t" * 65),
    "a version that is not an integer": _body(write_version="1"),
    "a version of zero": _body(write_version=0),
    "a version that is a boolean": _body(write_version=True),
}


@pytest.mark.parametrize("case", list(BAD_STARTS))
def test_bad_admissions_are_refused_and_admit_nothing(gateway: Gateway, case: str) -> None:
    run = launch()
    response = call(gateway.url, run.token(), BAD_STARTS[case])
    refused(response, 400, "GATEWAY_BAD_REQUEST")
    assert intents(run.run_id) == [] and db_rows(run.org_id) == {}


BAD_WRITES = {
    "a result that is not JSON (NaN)":
        b'{"action":"sheet_write","table":"companies","write_version":1,'
        b'"rows":[{"key":"a.com","status":"done","result":NaN}]}',
    "a result nested too deep":
        b'{"action":"sheet_write","table":"companies","write_version":1,'
        b'"rows":[{"key":"a.com","status":"done","result":' + b"[" * 100 + b"]" * 100 + b"}]}",
    "an integer out of range":
        b'{"action":"sheet_write","table":"companies","write_version":1,'
        b'"rows":[{"key":"a.com","status":"done","result":123456789012345678901234}]}',
}


@pytest.mark.parametrize("case", list(BAD_WRITES))
def test_results_that_are_not_storable_json_are_refused(gateway: Gateway, case: str) -> None:
    run = launch()
    ok(start(gateway.url, run, page("a.com")))
    refused(call(gateway.url, run.token(), None, raw=BAD_WRITES[case]), 400,
            "GATEWAY_BAD_REQUEST")
    assert db_rows(run.org_id)["a.com"][0] == "pending"


@pytest.mark.parametrize(("rows", "why"), [
    ([{"key": "a.com", "status": "done", "result": "x" * 70_000}], "limit"),
    ([{"key": "a.com", "status": "failed"}], "error"),
    ([{"key": "a.com", "status": "done", "result": 1, "error": "also"}], "error"),
    ([{"key": "a.com", "status": "weird", "result": 1}], "status"),
    (done("a.com") + done("a.com"), "more than once"),
    ([], "rows"),
])
def test_malformed_row_writes_are_refused(gateway: Gateway, rows: list[Any], why: str) -> None:
    run = launch()
    version = ok(start(gateway.url, run, page("a.com")))["write_version"]
    error = refused(write(gateway.url, run, version, rows), 400, "GATEWAY_BAD_REQUEST")
    assert why in error
    assert db_rows(run.org_id)["a.com"] == ("pending", version, None)


def test_unknown_fields_are_refused(gateway: Gateway) -> None:
    run = launch()
    refused(call(gateway.url, run.token(), _body(stable=True)), 422, "GATEWAY_UNKNOWN_FIELD")
    refused(call(gateway.url, run.token(), _body(rows=[{"key": "a", "data": {}, "x": 1}])),
            422, "GATEWAY_UNKNOWN_FIELD")


def test_concurrent_first_starts_of_one_run_and_table_all_get_one_version(
        gateway: Gateway) -> None:
    """20 rounds of 50 simultaneous first admissions (1,000 races): 0 divergent versions."""
    divergent = 0
    client = runner_client.Gateway(gateway.url, None)  # the runner's own HTTP client
    for _ in range(20):
        run = launch()
        token = run.token()
        barrier = threading.Barrier(50)
        versions: list[int] = []
        errors: list[str] = []

        def first_start(i: int, token: str = token, barrier: threading.Barrier = barrier,
                        versions: list[int] = versions, errors: list[str] = errors) -> None:
            body = {"action": "sheet_start_with_intent", "table": "companies",
                    "rows": page(f"r{i}.com", "shared.com")}
            barrier.wait()
            try:
                versions.append(client.call(token, body)["write_version"])
            except (runner_client.Refused, runner_client.Unavailable) as exc:
                errors.append(str(exc))

        threads = [threading.Thread(target=first_start, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(versions) == 50
        divergent += len(set(versions)) - 1
        assert [i[0] for i in intents(run.run_id)] == versions[:1]
        assert {v[1] for v in db_rows(run.org_id).values()} == set(versions[:1])
    assert divergent == 0


def test_the_sheet_counter_makes_each_new_run_newer(gateway: Gateway) -> None:
    org = new_org()
    versions = []
    for _ in range(5):
        run = launch(org)
        versions.append(ok(start(gateway.url, run, page("a.com")))["write_version"])
    assert versions == sorted(versions) and len(set(versions)) == 5
    with session_scope() as s:
        sheet = s.scalars(sa.select(Sheet).where(Sheet.org_id == org,
                                                 Sheet.play == PLAY_NAME)).one()
        assert sheet.last_version == versions[-1]
        owned = s.scalar(sa.select(SheetRow.write_version).where(SheetRow.sheet_id == sheet.id))
    assert owned == versions[-1]


def test_racing_first_admissions_reread_the_winner_without_the_fence_lock(pg_url: str) -> None:
    """The insert-if-absent itself keeps one version, not just the fence's run lock: 100
    rounds of 10 transactions racing the same first admission (1,000 races)."""
    divergent = lost = 0
    for _ in range(100):
        run_id = new_run(new_org())
        with session_scope() as s:
            sheet_id = store.ensure_sheet(s, new_org(), "race", "t")
        barrier = threading.Barrier(10)
        resolved: list[store.Resolved] = []

        def race(run_id: str = run_id, sheet_id: int = sheet_id,
                 barrier: threading.Barrier = barrier,
                 resolved: list[store.Resolved] = resolved) -> None:
            barrier.wait()
            with session_scope() as s:
                found = store.resolve_stable_intent(s, sheet_id, run_id, 1, "t", None)
            resolved.append(found)

        threads = [threading.Thread(target=race) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(resolved) == 10 and sum(r.minted for r in resolved) == 1
        divergent += len({r.version for r in resolved}) - 1
        lost += sum(r.lost_race for r in resolved)
    assert divergent == 0
    assert lost > 0  # the losing-insert path ran, and re-read the winner every time
