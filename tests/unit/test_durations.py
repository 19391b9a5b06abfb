"""parse_duration: each unit at most once, in the order d h m s; positive, finite, bounded."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.errors import InputInvalidError, PlayrunError
from tasks.parse.durations import DurationInvalidError, parse_duration

YEAR = 365 * 86400


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("10m", 600), ("1h", 3600), ("2d", 172800),
    ("1h30m", 5400), ("1d2h3m4s", 93784), ("1d4s", 86404), ("0.5s", 0.5), ("1.5h", 5400),
    (" 10M ", 600), ("1h0m", 3600), ("365d", YEAR), ("0.001", 0.001), ("007m", 420),
])
def test_good_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [
    "1h1h", "30m1h", "1s1m", "1m1m", "1d1d", "2h1d", "1s1s",  # repeated or out of order
    "", " ", "h", "0", "0s", "0h0m", "-1", "-1s", "+5s", "1e3", "1e3s", "nan", "inf",
    "infs", "nans", "-inf", "1_000s", "1 h", "1h 30m", "1w", "1y", "1ms", "5sec", ".5s", "5.s",
    "\x00", "1s\x00", "\ud800", "٣s", "1h\n30m", "366d", "8761h", "9" * 70, "1" * 10 + "s",
    "1.0000000001d",  # ten decimals: past the nine the grammar allows
])
def test_bad_durations(text: str) -> None:
    with pytest.raises(DurationInvalidError) as err:
        parse_duration(text)
    assert err.value.code == "DURATION_INVALID"


@pytest.mark.parametrize("value", [None, 10, 1.5, b"10s", ["10s"], float("nan")])
def test_non_text_is_refused(value: Any) -> None:
    with pytest.raises(DurationInvalidError):
        parse_duration(value)


def test_the_bound_is_configurable_and_errors_share_the_input_root() -> None:
    assert parse_duration("3650d", maximum=10 * YEAR) == 10 * YEAR
    with pytest.raises(DurationInvalidError) as err:
        parse_duration("3651d", maximum=10 * YEAR)
    assert isinstance(err.value, InputInvalidError) and isinstance(err.value, PlayrunError)


parts = st.tuples(*(st.one_of(st.none(), st.integers(0, 400)) for _ in "dhms"))


@given(parts)
def test_each_unit_once_in_order_adds_up(p: tuple[int | None, ...]) -> None:
    text = "".join(f"{n}{u}" for n, u in zip(p, "dhms", strict=True) if n is not None)
    total = sum(n * k for n, k in zip(p, (86400, 3600, 60, 1), strict=True) if n is not None)
    if not text or total <= 0 or total > YEAR:
        with pytest.raises(DurationInvalidError):
            parse_duration(text)
    else:
        assert parse_duration(text) == total


@given(st.text(max_size=20))
def test_any_text_is_a_bounded_positive_duration_or_refused(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except DurationInvalidError:
        return
    assert math.isfinite(seconds) and 0 < seconds <= YEAR
