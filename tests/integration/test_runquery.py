"""Run listings (filters, keyset pages) and run-id prefixes, on PostgreSQL and SQLite."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import tasks
from models import PlayBundle, Run
from tasks.errors import InputInvalidError, RunIdAmbiguousError, RunNotFoundError
from tasks.store.db import session_scope
from tests.support.paths import ROOT
from tests.support.stack import worker_env

T0 = datetime(2026, 11, 30, 12, 0, 0, 123000, tzinfo=UTC)  # ms: SQLite keeps milliseconds


@pytest.fixture(params=["postgresql", "sqlite"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    url = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_db")
    yield url


def _insert(org: str, rows: list[tuple[str, datetime, str, str | None]]) -> None:
    """Runs with chosen ids, times, statuses and codes (terminal ones: nothing adopts them)."""
    source = f"def run(ctx, input):\n    return {org!r}\n"
    digest = hashlib.sha256(source.encode()).hexdigest()
    with session_scope() as session:
        if session.get(PlayBundle, digest) is None:
            session.add(PlayBundle(digest=digest, source=source, size=len(source)))
            session.flush()
        for run_id, created, status, code in rows:
            session.add(Run(id=run_id, org_id=org, play_path="plays/q.py", play_digest=digest,
                            input={}, status=status, code=code, current_generation=0,
                            deferral_count=0, deferral_total_ms=0, created_at=created,
                            finished_at=created))


def _org() -> str:
    return f"q-{uuid.uuid4().hex[:10]}"


def _ids(n: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(n)]


def test_pages_never_skip_or_repeat_runs_created_at_the_same_instant(backend: str) -> None:
    org = _org()
    ids = _ids(7)
    # Five runs share one timestamp, two are older: pages of 2 must walk all 7 in order.
    _insert(org, [(i, T0, "succeeded", None) for i in ids[:5]]
            + [(ids[5], T0 - timedelta(seconds=1), "succeeded", None),
               (ids[6], T0 - timedelta(seconds=2), "succeeded", None)])
    expected = sorted(ids[:5], reverse=True) + [ids[5], ids[6]]
    seen: list[str] = []
    before = None
    while True:
        page = tasks.list_runs(2, org, before=before)
        seen += [v.id for v in page]
        if len(page) < 2:
            break
        before = tasks.run_cursor(page[-1])
    assert seen == expected
    assert all(v.created_at.tzinfo is not None for v in tasks.list_runs(10, org))


def test_filters_by_status_code_and_time(backend: str) -> None:
    org, other = _org(), _org()
    a, b, c, d = _ids(4)
    _insert(org, [(a, T0, "failed", "PLAY_ERROR"), (b, T0 + timedelta(minutes=1), "failed",
                                                    "RUN_TIMEOUT"),
                  (c, T0 + timedelta(minutes=2), "succeeded", None)])
    _insert(other, [(d, T0 + timedelta(minutes=3), "failed", "PLAY_ERROR")])

    def ids(**kw: object) -> list[str]:
        return [v.id for v in tasks.list_runs(50, org, **kw)]  # type: ignore[arg-type]

    assert ids() == [c, b, a]
    assert ids(status="failed") == [b, a]
    assert ids(code="PLAY_ERROR") == [a]
    assert ids(status="succeeded", code="PLAY_ERROR") == []
    assert ids(since=T0 + timedelta(minutes=1)) == [c, b]
    assert ids(until=T0 + timedelta(minutes=1)) == [a]
    assert ids(since=T0, until=T0 + timedelta(minutes=2)) == [b, a]
    # Without an org every org is listed; the filter then finds the other org's run too.
    found = [v.id for v in tasks.list_runs(50, code="PLAY_ERROR",
                                           since=T0, until=T0 + timedelta(minutes=4))]
    assert a in found and d in found and b not in found
    # The old positional call still works.
    assert [v.id for v in tasks.list_runs(1, org)] == [c]


@pytest.mark.parametrize(("kwargs", "code"), [
    ({"status": "done"}, "INPUT_INVALID"),
    ({"status": 3}, "INPUT_INVALID"),
    ({"code": "play_error"}, "INPUT_INVALID"),
    ({"code": "X" * 65}, "INPUT_INVALID"),
    ({"since": datetime(2026, 1, 1)}, "INPUT_INVALID"),  # naive: which zone?
    ({"until": "yesterday"}, "INPUT_INVALID"),
    ({"before": "12.zz"}, "INPUT_INVALID"),
    ({"before": "1" * 18 + "." + "a" * 32}, "INPUT_INVALID"),
    ({"limit": 0}, "INPUT_INVALID"),
    ({"limit": True}, "INPUT_INVALID"),
    ({"org_id": "a\x00b"}, "INPUT_INVALID"),
])
def test_bad_listing_arguments_are_refused_with_a_code(kwargs: dict[str, object],
                                                       code: str) -> None:
    with pytest.raises(InputInvalidError) as err:
        tasks.list_runs(**kwargs)  # type: ignore[arg-type]
    assert err.value.code == code


def test_a_unique_prefix_resolves_and_ambiguous_or_missing_ones_are_refused(
        backend: str) -> None:
    base = uuid.uuid4().hex[:10]
    first, second = base + "0" * 22, base + "1" * 22
    _insert(_org(), [(first, T0, "succeeded", None), (second, T0, "succeeded", None)])
    assert tasks.resolve_run_id(base + "0") == first
    assert tasks.resolve_run_id(second) == second
    with pytest.raises(RunIdAmbiguousError) as err:
        tasks.resolve_run_id(base)
    assert err.value.code == "RUN_ID_AMBIGUOUS" and isinstance(err.value, InputInvalidError)
    assert first in err.value.message and second in err.value.message
    with pytest.raises(RunNotFoundError):
        tasks.resolve_run_id(base + "2")
    with pytest.raises(RunNotFoundError):
        tasks.resolve_run_id("not-hex!")
    with pytest.raises(InputInvalidError, match="at least 6"):
        tasks.resolve_run_id(base[:5])


def _cli(*args: str, env: dict[str, str] | None = None, columns: int = 80
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tasks.cli.main", *args], cwd=str(ROOT),
                          env={**(env or worker_env()), "COLUMNS": str(columns)},
                          capture_output=True, text=True, timeout=60)


def test_cli_runs_filters_pages_as_json_and_never_cuts_an_id(pg_url: str) -> None:
    org = _org()
    ids = _ids(3)
    _insert(org, [(ids[0], T0, "failed", "RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE"),
                  (ids[1], T0 + timedelta(seconds=1), "failed", "PLAY_ERROR"),
                  (ids[2], T0 + timedelta(seconds=2), "succeeded", None)])
    shown = _cli("runs", "--org", org, "--status", "failed")
    assert shown.returncode == 0, shown.stderr
    assert max(len(line) for line in shown.stdout.splitlines()) <= 80
    lines = shown.stdout.splitlines()
    assert any(ids[0] in line for line in lines) and any(ids[1] in line for line in lines)
    assert ids[2] not in shown.stdout
    first = json.loads(_cli("runs", "--org", org, "--limit", "2", "--json").stdout)
    assert [r["id"] for r in first["runs"]] == [ids[2], ids[1]] and first["next"]
    rest = json.loads(_cli("runs", "--org", org, "--limit", "2", "--json",
                           "--before", first["next"]).stdout)
    assert [r["id"] for r in rest["runs"]] == [ids[0]] and rest["next"] is None
    assert rest["runs"][0]["code"] == "RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE"
    since = json.loads(_cli("runs", "--org", org, "--json", "--since",
                            (T0 + timedelta(seconds=1)).isoformat()).stdout)
    assert [r["id"] for r in since["runs"]] == [ids[2], ids[1]]
    bad = _cli("runs", "--status", "nope")
    assert bad.returncode == 2 and bad.stderr.startswith("error INPUT_INVALID:")
    assert "Traceback" not in bad.stderr


def test_cli_show_and_cancel_take_a_unique_prefix(pg_url: str) -> None:
    base = uuid.uuid4().hex[:8]
    one, two = base + "a" * 24, base + "b" * 24
    _insert(_org(), [(one, T0, "succeeded", None), (two, T0, "succeeded", None)])
    shown = _cli("show", base + "a", "--no-events", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == one
    cancelled = _cli("cancel", two[:12])
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["status"] == "succeeded"  # a terminal already won
    ambiguous = _cli("show", base)
    assert ambiguous.returncode == 2
    assert ambiguous.stderr.startswith("error RUN_ID_AMBIGUOUS:") and one in ambiguous.stderr
    with session_scope() as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(Run)
                              .where(Run.id.in_([one, two]))) == 2
