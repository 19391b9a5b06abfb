"""Untrusted arguments from app code never reach SQL raw.

Odd values (NUL, lone surrogates, deep nesting, huge ints, NaN/inf, huge strings,
wrong types) are fed into submit_run, get_run, cancel_run, run_events, list_runs
and RunHandle.wait against the real PostgreSQL database, and once on SQLite. Each
call either succeeds exactly when an independent oracle says the arguments are
valid, or raises a PlayrunError with an expected code; nothing else escapes.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import tasks
import tasks.api
from models import Outbox, Run, db_now
from tasks.admission import validate
from tasks.admission.submit import admit
from tasks.errors import InputInvalidError, PlayInvalidError, PlayrunError, RunNotFoundError
from tasks.parse import checks
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tests.support.input_oracle import (
    INT64,
    MAX_BYTES,
    nested,
    valid_input,
    valid_name,
)
from tests.support.paths import HELLO, NOOP
from tests.support.runs import close_open_runs

ORG_PREFIX = "val-"
SUBMIT_CODES = {"INPUT_INVALID", "PLAY_INVALID", "PLAY_NOT_FOUND"}


# --- strategies ---------------------------------------------------------------------------

DEEP = nested(100_000)  # json.dumps of this raises RecursionError


class Deep(list[Any]):
    """DEEP as hypothesis sees it: it prints a falsifying example with a recursive printer
    that DEEP itself would overflow, hiding the real failure behind a RecursionError."""

    def __repr__(self) -> str:
        return "nested(100_000)"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))
HUGE = "x" * (MAX_BYTES + 10)
odd_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\x00", "a\x00b", "\ud800", "a\udfffb", "\n", "tab\there",
                     "é", "\U0001f600", "x" * 300, HUGE]),
)
odd_scalar = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.sampled_from([INT64 - 1, INT64, -INT64, -INT64 + 1, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    odd_text,
)
odd_json = st.recursive(
    odd_scalar,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.one_of(odd_text, st.integers(), st.none()), inner, max_size=4),
    max_leaves=12,
)
odd_object = st.one_of(
    st.binary(max_size=8), st.just(Deep(DEEP)), st.just(nested(64)), st.just(nested(65)),
    st.just([HUGE]), st.just({"big": "y" * MAX_BYTES}), st.just([0] * 200_000),
    st.just({1, 2}), st.just(object()), st.just(Path("x")), st.just(b"\x00"),
    st.just(float("nan")), st.just([float("inf")]), st.just({"k": 2**64}),
)
def half(good: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`good` half of the time (one_of alone would flatten and drown it among odd branches)."""
    return st.booleans().flatmap(lambda take_good: good if take_good else odd)


# Valid values too, so that a good share of the calls must succeed.
good_chars = st.characters(blacklist_categories=("Cs", "Cc"))
good_text = st.text(good_chars, min_size=1, max_size=30).filter(lambda s: s.strip() != "")
good_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63) + 1, 2**63 - 1)
    | st.floats(-9e15, 9e15) | st.text(st.characters(blacklist_categories=("Cs",),
                                                      blacklist_characters="\x00")),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(good_chars, max_size=8), inner, max_size=4),
    max_leaves=12,
)
odd_value = half(good_json, st.one_of(odd_json, odd_object))
odd_org = half(st.builds(lambda s: ORG_PREFIX + s, good_text),
               st.one_of(st.builds(lambda s: ORG_PREFIX + s, odd_text), odd_scalar, odd_object))
odd_key = half(st.one_of(st.none(), st.builds(lambda: uuid.uuid4().hex), good_text),
               st.one_of(odd_text, odd_scalar, odd_object))
odd_run_id = st.one_of(
    odd_scalar, odd_object,
    st.builds(lambda: uuid.uuid4().hex), st.builds(lambda: uuid.uuid4().hex.upper()),
    st.builds(lambda: uuid.uuid4().hex + "\x00"), st.builds(lambda: uuid.uuid4().hex + "\n"),
    st.builds(lambda: uuid.uuid4().hex[:31] + "\ud800"), st.builds(lambda: str(uuid.uuid4())),
    st.just("0" * 32), st.just("g" * 32), st.just("a" * 33),
)


@pytest.fixture(scope="module")
def plays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, str | None]]:
    """Plays to submit, each with the code submit_run must raise (None: it is valid)."""
    root = tmp_path_factory.mktemp("plays")
    nul = root / "nul.py"
    nul.write_bytes(b"def run(ctx, input):\n    return '\x00'\n")
    latin = root / "latin.py"
    latin.write_bytes(b"# \xe9\ndef run(ctx, input):\n    return 1\n")
    return {
        "hello": (HELLO, None), "hello-str": (str(HELLO), None),
        "nul-source": (nul, "PLAY_INVALID"), "not-utf8": (latin, "PLAY_INVALID"),
        "missing": (root / "missing.py", "PLAY_NOT_FOUND"),
        "directory": (root, "PLAY_NOT_FOUND"),
        "name-too-long": (str(root / ("a" * 300)), "PLAY_NOT_FOUND"),
        "nul-path": ("plays/a\x00.py", "INPUT_INVALID"),
        "surrogate-path": ("plays/\udcff.py", "INPUT_INVALID"),
        "path-too-long": ("p/" * 600, "INPUT_INVALID"),
        "empty": ("", "INPUT_INVALID"), "bytes": (b"plays/hello.py", "INPUT_INVALID"),
        "int": (7, "INPUT_INVALID"), "none": (None, "INPUT_INVALID"),
    }


@pytest.fixture
def unpublished(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """submit_run without the broker: fuzzed runs must never reach a later test's worker."""
    sent: list[str] = []
    monkeypatch.setattr(tasks.api, "publish_admitted",
                        lambda messages: sent.extend(m[0] for m in messages))
    yield sent
    with session_scope() as session:
        session.execute(sa.update(Outbox).where(Outbox.id.in_(sent)).values(sent_at=db_now()))
    close_open_runs(ORG_PREFIX)


def stored_input(run_id: str) -> Any:
    with session_scope(readonly=True) as session:
        run = session.get(Run, run_id)
        assert run is not None
        return run.input


def run_count() -> int:
    with session_scope(readonly=True) as session:
        return int(session.scalar(sa.select(sa.func.count()).select_from(Run)) or 0)


def expect(call: Callable[[], Any], ok: bool, codes: set[str]) -> Any:
    """`call` succeeds iff `ok`; otherwise it raises a PlayrunError with one of `codes`."""
    try:
        result = call()
    except PlayrunError as exc:
        event(f"refused {exc.code}")
        assert not ok, f"refused a valid call: {exc}"
        assert exc.code in codes, exc
        return exc
    event("accepted")
    assert ok, f"accepted an invalid call, returned {result!r:.200}"
    return result


_USED_KEYS: set[str] = set()  # (database, org, key) an accepted submit used, across examples


def check_submit(play: tuple[Any, str | None], value: Any, org: Any, key: Any) -> None:
    play_arg, play_code = play
    args_ok = valid_name(org, 128) and (key is None or valid_name(key, 256))
    input_ok = valid_input(value)
    ok = args_ok and input_ok and play_code is None
    before = run_count()
    # Per database: the PostgreSQL and SQLite tests each start with no key used. Only
    # valid (string) names are looked at: repr of a hostile one can overflow the stack.
    used = f"{get_settings().database_url}\x00{org}\x00{key}" if ok and key is not None else ""
    if used in _USED_KEYS:
        # An earlier example used this key: the same input returns its run, another
        # input is a conflict naming it. Either way nothing new is written.
        try:
            tasks.submit_run(play_arg, value, org_id=org, idempotency_key=key)
        except tasks.IdempotencyConflictError as exc:
            assert exc.run_id, exc
        assert run_count() == before
        return
    outcome = expect(lambda: tasks.submit_run(play_arg, value, org_id=org, idempotency_key=key),
                     ok, SUBMIT_CODES)
    if used:
        _USED_KEYS.add(used)
    if isinstance(outcome, PlayrunError):
        # Arguments and input are checked first, the play file last.
        assert outcome.code == (play_code if args_ok and input_ok else "INPUT_INVALID"), outcome
        assert run_count() == before, "a refused submit wrote a run"
        return
    assert checks.RUN_ID.fullmatch(outcome.id)
    view = tasks.get_run(outcome.id)
    assert (view.org_id, view.idempotency_key) == (org, key)
    if outcome.created:  # (a repeated key returns the first run, with its own input)
        assert stored_input(outcome.id) == value, "the input did not round-trip"
        assert run_count() == before + 1


ODD = settings(max_examples=120, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture,
                                      HealthCheck.too_slow, HealthCheck.data_too_large])


@ODD
@given(name=st.sampled_from(["hello"] * 8 + ["hello-str", "nul-source", "not-utf8", "missing",
                             "directory", "name-too-long", "nul-path", "surrogate-path",
                             "path-too-long", "empty", "bytes", "int", "none"]),
       value=odd_value, org=odd_org, key=odd_key)
def test_submit_run_accepts_exactly_the_valid_arguments(
        pg_url: str, unpublished: list[str], plays: dict[str, tuple[Any, str | None]],
        name: str, value: Any, org: Any, key: Any) -> None:
    check_submit(plays[name], value, org, key)


@ODD
@given(value=odd_value)
def test_any_input_with_a_good_play_and_org(pg_url: str, unpublished: list[str],
                                            value: Any) -> None:
    check_submit((HELLO, None), value, ORG_PREFIX + "input", None)


@pytest.fixture(scope="module")
def known_run(pg_url: str) -> str:
    run_id = admit(NOOP, {}, ORG_PREFIX + "known", None).run_id
    with session_scope() as session:
        session.execute(sa.update(Outbox).where(Outbox.run_id == run_id)
                        .values(sent_at=db_now()))
    return run_id


@ODD
@given(run_id=st.one_of(st.just("KNOWN"), odd_run_id))
def test_run_lookups_find_only_real_runs(pg_url: str, known_run: str, run_id: Any) -> None:
    run_id = known_run if run_id == "KNOWN" else run_id
    exists = type(run_id) is str and run_id == known_run
    view = expect(lambda: tasks.get_run(run_id), exists, {"RUN_NOT_FOUND"})
    if exists:
        assert view.id == known_run
    events = expect(lambda: tasks.run_events(run_id), exists, {"RUN_NOT_FOUND"})
    if exists:
        assert events[0].kind == "run.admitted"
    cancelled = expect(lambda: tasks.cancel_run(run_id), exists, {"RUN_NOT_FOUND"})
    if exists:
        assert cancelled.status == "cancelled"


@ODD
@given(run_id=half(st.just("KNOWN"), odd_run_id),
       timeout=half(st.one_of(st.none(), st.floats(0, 1e6), st.integers(0, 10**6)),
                    st.one_of(odd_scalar, odd_object)))
def test_wait_checks_its_id_and_timeout(pg_url: str, known_run: str, run_id: Any,
                                        timeout: Any) -> None:
    tasks.cancel_run(known_run)  # terminal, so a valid wait returns at once
    run_id = known_run if run_id == "KNOWN" else run_id
    exists = type(run_id) is str and run_id == known_run
    timeout_ok = timeout is None or (type(timeout) in (int, float)
                                     and 0 <= timeout <= 365 * 86400)  # (NaN compares False)
    handle = tasks.RunHandle(run_id)
    outcome = expect(lambda: handle.wait(timeout=timeout), exists and timeout_ok,
                     {"RUN_NOT_FOUND", "INPUT_INVALID"})
    if isinstance(outcome, PlayrunError):
        assert outcome.code == ("INPUT_INVALID" if not timeout_ok else "RUN_NOT_FOUND")
    else:
        assert outcome.status == "cancelled"


@ODD
@given(limit=half(st.integers(-3, 10_003), odd_scalar),
       org=half(st.sampled_from([None, ORG_PREFIX + "known"]), odd_org))
def test_list_runs_checks_limit_and_org(pg_url: str, known_run: str, limit: Any,
                                        org: Any) -> None:
    ok = (type(limit) is int and 1 <= limit <= 10_000
          and (org is None or valid_name(org, 128)))
    views = expect(lambda: tasks.list_runs(limit=limit, org_id=org), ok, {"INPUT_INVALID"})
    if ok:
        assert len(views) <= limit
        assert org is None or all(v.org_id == org for v in views)


# --- specific odd values, each once ------------------------------------------------------

@pytest.mark.parametrize("value", [
    DEEP, {"a": DEEP}, nested(65), float("nan"), [float("-inf")], {"n": 2**63}, 1e16, -1e300,
    {"n": -(2**63)}, 10**400, "a\x00b", {"k\x00": 1}, ["\ud800"], {"\udfff": 1},
    {1: "int key"}, {None: 1}, {1, 2}, b"bytes", object(), {"big": "x" * MAX_BYTES},
    [None] * MAX_BYTES,
])
def test_check_input_refuses(value: Any) -> None:
    with pytest.raises(InputInvalidError) as err:
        validate.check_input(value)
    assert err.value.code == "INPUT_INVALID"


def test_check_input_accepts_the_edges_and_returns_plain_json() -> None:
    edge = {"deep": nested(63), "max": 2**63 - 1, "min": -(2**63) + 1, "f": 9.999999999999998e15,
            "tiny": 5e-324, "t": (1, 2), "s": "é\U0001f600\n\t"}
    plain = validate.check_input(edge)
    assert plain["t"] == [1, 2] and type(plain["t"]) is list
    assert plain["max"] == 2**63 - 1
    assert validate.check_input(nested(64)) == nested(64)


def test_parse_input_text_refuses_deep_and_non_json_text() -> None:
    for text in ["[" * 100_000 + "]" * 100_000, "NaN", "[Infinity]", "{", "1" * 5000,
                 '"\\u0000"', '["\\ud800"]', " " * (5 * MAX_BYTES)]:
        with pytest.raises(InputInvalidError):
            validate.parse_input_text(text)
    assert validate.parse_input_text('{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}


def test_a_huge_input_is_refused_without_reading_all_of_it() -> None:
    # 50 million items: walking all of them would take many seconds; the budget stops early.
    class Endless(list[int]):
        def __iter__(self) -> Iterator[int]:
            n = 0
            while True:
                n += 1
                assert n < 10 * MAX_BYTES, "the whole value was walked"
                yield 0

    with pytest.raises(InputInvalidError, match="limit"):
        validate.check_input(Endless())


def test_play_source_with_nul_is_play_invalid(tmp_path: Path, pg_url: str) -> None:
    play = tmp_path / "nul.py"
    play.write_bytes(b"def run(ctx, input):\n    return 1\n\x00")
    with pytest.raises(PlayInvalidError) as err:
        tasks.submit_run(play, {}, org_id=ORG_PREFIX + "nul")
    assert err.value.code == "PLAY_INVALID"


def test_bad_run_ids_are_refused_before_any_query(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_db(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a malformed run id reached the database")

    monkeypatch.setattr(tasks.api, "session_scope", no_db)
    monkeypatch.setattr(tasks.api, "ensure_schema_once", no_db)
    for bad in ["", "\x00", "\ud800", "A" * 32, "a" * 31, "a" * 33, 7, None, b"0" * 32,
                "0" * 31 + "\n", str(uuid.uuid4())]:
        for call in (tasks.get_run, tasks.run_events, tasks.cancel_run):
            with pytest.raises(RunNotFoundError):
                call(bad)  # type: ignore[arg-type]
        with pytest.raises(RunNotFoundError):
            tasks.RunHandle(bad).wait(timeout=0)  # type: ignore[arg-type]


# --- once on SQLite -----------------------------------------------------------------------


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(value=odd_value, org=odd_org, key=odd_key, run_id=odd_run_id)
def test_odd_arguments_on_sqlite(sqlite_db: str, unpublished: list[str], value: Any,
                                 org: Any, key: Any, run_id: Any) -> None:
    check_submit((HELLO, None), value, org, key)
    expect(lambda: tasks.get_run(run_id), False, {"RUN_NOT_FOUND"})
    expect(lambda: tasks.run_events(run_id), False, {"RUN_NOT_FOUND"})
    expect(lambda: tasks.cancel_run(run_id), False, {"RUN_NOT_FOUND"})
