"""Operator input at the CLI: a bad number or duration is one line with its code on
stderr and exit status 2, never a traceback; a good one still does its job.

The fuzz runs in-process with typer's CliRunner, with the setters replaced by
recorders (a fuzzed good value must not change the fleet's policy mid-session);
a few real `python -m tasks.cli.main` processes and real good values close the loop.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from tasks.acquisition import capacity, policy
from tasks.admission.validate import parse_input_text
from tasks.cli.main import app
from tasks.errors import InputInvalidError
from tasks.maintenance import gc
from tasks.parse.durations import parse_duration
from tasks.store.db import session_scope
from tests.support.paths import ROOT
from tests.support.stack import worker_env

YEAR = 365 * 86400.0
MAX_INT = 2**31 - 1
runner = CliRunner()

FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

EDGE_NUMBERS = [
    "nan", "NaN", "-nan", "inf", "+inf", "-inf", "Infinity", "1e400", "-1e400", "1e-400", "-1",
    "0", "-0", "0.0", "00", "1_000", "0x10", " 5", "5 ", "", "١٢", "5\x00", "\ud800", "1e6",
    "1000000", "1000000.0000001", "1e3", "2147483647", "2147483648", "9" * 70, ".5", "5.", "+5",
    "--5", "e5", "10000", "10001", "31536000", "31536001",
]
EDGE_DURATIONS = [
    "1h1h", "30m1h", "nan", "inf", "-1", "0", "0s", "1e3", "366d", "10m", "1h30m", "1d2h3m4s",
    "90", "1.5h", "3650d", "3651d", "", "\x00", "\ud800", "1 h", "1w", "1m1m", "1d-1h",
]
number_text = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(allow_nan=True, allow_infinity=True).map(str).map(str.upper),
    st.integers().map(str),
    st.integers(-5, MAX_INT + 5).map(str),
    st.sampled_from(EDGE_NUMBERS),
    st.text(max_size=12),
)
duration_text = st.one_of(
    st.sampled_from(EDGE_DURATIONS),
    st.builds(lambda n, u: f"{n}{u}", st.integers(-2, 10**6), st.sampled_from("dhms")),
    st.text(max_size=10),
)


def decimal(text: str) -> float | None:
    """The operator-number grammar, stated independently: ASCII decimal, finite."""
    if not 0 < len(text) <= 64 or any(c not in "0123456789+-.eE" for c in text):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def whole(text: str) -> int | None:
    if not 0 < len(text) <= 64 or any(c not in "0123456789" for c in text):
        return None
    value = int(text)
    return value if value <= MAX_INT else None


def duration(text: str, maximum: float = YEAR) -> float | None:
    try:
        return parse_duration(text, maximum=maximum)
    except InputInvalidError:
        return None


def cli(*args: str) -> Result:
    return runner.invoke(app, list(args))


def refused(result: Result, code: str) -> None:
    """Exit 2, exactly one line on stderr naming the code, no traceback anywhere."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.exception
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error {code}: "), result.stderr
    assert "Traceback" not in result.output


def accepted(result: Result) -> None:
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stderr == ""


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch, pg_url: str) -> Iterator[list[tuple[Any, ...]]]:
    """The policy and capacity setters and the GC pass, recording what reached them."""
    calls: list[tuple[Any, ...]] = []

    def set_policy(mode: str, **kw: Any) -> policy.Policy:
        calls.append((mode, kw.get("for_s"), kw.get("starts_per_minute")))
        return policy.Policy(mode)

    monkeypatch.setattr(policy, "set_policy", set_policy)
    monkeypatch.setattr(capacity, "set_limit", lambda org, n: calls.append(("limit", org, n)))
    monkeypatch.setattr(gc, "collect", lambda _p, grace, **_kw: calls.append(("gc", grace))
                        or gc.GcReport())
    yield calls


def check_throttle(recorded: list[tuple[Any, ...]], text: str, for_: str) -> None:
    recorded.clear()
    result = cli("policy", "throttle", f"--for={for_}", "--", text)
    rate, seconds = decimal(text), duration(for_)
    if rate is None or not 0 < rate <= 1_000_000:
        refused(result, "POLICY_INVALID")
    elif seconds is None:
        refused(result, "DURATION_INVALID")
    else:
        accepted(result)
        assert recorded == [(policy.THROTTLE, seconds, rate)]
        assert math.isfinite(seconds) and 0 < seconds <= YEAR
        return
    assert recorded == []


def check_hold(recorded: list[tuple[Any, ...]], for_: str) -> None:
    recorded.clear()
    result = cli("policy", "hold", f"--for={for_}")
    seconds = duration(for_)
    if seconds is None:
        refused(result, "DURATION_INVALID")
        assert recorded == []
    else:
        accepted(result)
        assert recorded == [(policy.HOLD, seconds, None)]


def check_capacity(recorded: list[tuple[Any, ...]], text: str, org: str) -> None:
    recorded.clear()
    result = cli("capacity", "set", "--", org, text)
    org_ok = org.strip() != "" and not any(ord(c) < 32 or ord(c) == 127
                                           or 0xD800 <= ord(c) <= 0xDFFF for c in org)
    count = whole(text)
    if org_ok and count is not None:
        accepted(result)
        assert recorded == [("limit", org, count)]
    else:
        refused(result, "INPUT_INVALID")
        assert recorded == []


def check_stats(since: str) -> None:
    result = cli("stats", f"--since={since}")
    window = duration(since, maximum=10 * YEAR)
    if window is None:
        refused(result, "DURATION_INVALID")
    else:
        accepted(result)
        assert json.loads(result.stdout)["window_s"] == window


def check_gc(recorded: list[tuple[Any, ...]], grace: str) -> None:
    recorded.clear()
    result = cli("gc", f"--grace={grace}")
    value = decimal(grace)
    if value is None or not 0 <= value <= YEAR:
        refused(result, "INPUT_INVALID")
        assert recorded == []
    else:
        accepted(result)
        assert recorded == [("gc", value)]


def check_runs(limit: str) -> None:
    result = cli("runs", f"--limit={limit}")
    n = whole(limit)
    if n is None or not 1 <= n <= 10_000:
        refused(result, "INPUT_INVALID")
    else:
        assert result.exit_code == 0, result.output


def check_submit(timeout: str, input_: str) -> None:
    missing = ROOT / "tests" / "plays" / f"missing-{uuid.uuid4().hex}.py"
    result = cli("submit", str(missing), f"--timeout={timeout}", f"--input={input_}",
                 "--org", "val-cli")
    if duration(timeout) is None:
        refused(result, "DURATION_INVALID")
        return
    try:
        parse_input_text(input_)
    except InputInvalidError:
        refused(result, "INPUT_INVALID")
        return
    refused(result, "PLAY_NOT_FOUND")  # everything else was fine; nothing was written


@FUZZ
@given(text=number_text, for_=duration_text)
def test_policy_throttle_rate_and_duration(recorded: list[tuple[Any, ...]], text: str,
                                           for_: str) -> None:
    check_throttle(recorded, text, for_)


@FUZZ
@given(for_=duration_text)
def test_policy_hold_duration(recorded: list[tuple[Any, ...]], for_: str) -> None:
    check_hold(recorded, for_)


@FUZZ
@given(text=number_text, org=st.one_of(st.just("val-cli"), st.text(max_size=8)))
def test_capacity_set_count(recorded: list[tuple[Any, ...]], text: str, org: str) -> None:
    check_capacity(recorded, text, org)


@FUZZ
@given(since=duration_text)
def test_stats_since(pg_url: str, since: str) -> None:
    check_stats(since)


@FUZZ
@given(grace=number_text)
def test_gc_grace(recorded: list[tuple[Any, ...]], grace: str) -> None:
    check_gc(recorded, grace)


@FUZZ
@given(limit=number_text)
def test_runs_limit(pg_url: str, limit: str) -> None:
    check_runs(limit)


INPUTS = ["{}", "null", "[" * 100_000, "NaN", "{", "1" * 5000, '"\\u0000"', '{"a": 1e400}']


@FUZZ
@given(timeout=duration_text, input_=st.one_of(st.sampled_from(INPUTS), st.text(max_size=8)))
def test_submit_timeout_and_input(pg_url: str, timeout: str, input_: str) -> None:
    check_submit(timeout, input_)


@pytest.mark.parametrize("text", EDGE_NUMBERS)
def test_every_edge_number_everywhere(recorded: list[tuple[Any, ...]], text: str) -> None:
    check_throttle(recorded, text, "1m")
    check_capacity(recorded, text, "val-cli")
    check_gc(recorded, text)
    check_runs(text)


@pytest.mark.parametrize("text", EDGE_DURATIONS)
def test_every_edge_duration_everywhere(recorded: list[tuple[Any, ...]], text: str) -> None:
    check_throttle(recorded, "5", text)
    check_hold(recorded, text)
    check_stats(text)
    check_submit(text, "{}")


@pytest.mark.parametrize("input_", INPUTS)
def test_every_edge_input(pg_url: str, input_: str) -> None:
    check_submit("10m", input_)


@pytest.mark.parametrize("run_id", ["nope", "\ud800", "0" * 32, "a\x00b"])
def test_show_and_cancel_of_a_bad_id(pg_url: str, run_id: str) -> None:
    refused(cli("show", run_id), "RUN_NOT_FOUND")
    refused(cli("cancel", run_id), "RUN_NOT_FOUND")


def test_negative_numbers_reach_the_checks_without_a_double_dash(
        recorded: list[tuple[Any, ...]]) -> None:
    refused(cli("policy", "throttle", "-1"), "POLICY_INVALID")
    refused(cli("policy", "throttle", "-inf", "--for", "1m"), "POLICY_INVALID")
    refused(cli("capacity", "set", "acme", "-1"), "INPUT_INVALID")
    refused(cli("policy", "hold", "--for", "-1"), "DURATION_INVALID")
    assert recorded == []


def test_good_values_still_work_for_real(pg_url: str) -> None:
    org = f"val-{uuid.uuid4().hex[:8]}"
    try:
        accepted(cli("policy", "throttle", "100000", "--for", "1m", "--reason", "cli test"))
        assert (policy.read().mode, policy.read().starts_per_minute) == (policy.THROTTLE, 1e5)
        accepted(cli("policy", "hold", "--for", "1m30s"))
        assert policy.read().mode == policy.HOLD
    finally:
        accepted(cli("policy", "normal"))
    assert policy.read().mode == policy.NORMAL
    accepted(cli("capacity", "set", org, "2147483647"))
    with session_scope(readonly=True) as s:
        assert capacity.limit_for(s, org, default=10) == MAX_INT
    accepted(cli("capacity", "unset", org))
    accepted(cli("stats", "--since", "3650d"))
    accepted(cli("gc", "--grace", "100000"))  # everything younger than a day is spared


@pytest.mark.parametrize(("args", "code"), [
    (["policy", "throttle", "nan"], "POLICY_INVALID"),
    (["capacity", "set", "acme", "1e400"], "INPUT_INVALID"),
    (["stats", "--since", "1h1h"], "DURATION_INVALID"),
    (["show", "\udcff"], "RUN_NOT_FOUND"),  # what Linux hands Python for the byte 0xff
])
def test_the_real_command_prints_one_line(pg_url: str, args: list[str], code: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "tasks.cli.main", *args], env=worker_env(),
                          cwd=str(ROOT), capture_output=True, timeout=60)
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 2, stderr
    assert len(stderr.splitlines()) == 1 and stderr.startswith(f"error {code}: "), stderr
    assert b"Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(("value", "ok"), [
    (0, True), (MAX_INT, True), (-1, False), (MAX_INT + 1, False), (True, False), (1.0, False),
    ("3", False), (None, True),
])
def test_set_limit_checks_where_it_stores(pg_url: str, value: Any, ok: bool) -> None:
    org = f"val-{uuid.uuid4().hex[:8]}"
    if ok:
        capacity.set_limit(org, value)
        with session_scope(readonly=True) as s:
            assert capacity.limit_for(s, org, default=10) == (10 if value is None else value)
        return
    with pytest.raises(InputInvalidError):
        capacity.set_limit(org, value)
    with session_scope(readonly=True) as s:
        assert capacity.limit_for(s, org, default=10) == 10
    for bad_org in ["", "a\x00", "\ud800", "o" * 129, 5]:
        with pytest.raises(InputInvalidError):
            capacity.set_limit(bad_org, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("revision", ["zzz", "\x00", "", "head\n"])
def test_db_upgrade_to_an_unknown_revision(pg_url: str, revision: str) -> None:
    refused(cli("db", "upgrade", "--revision", revision), "INPUT_INVALID")
