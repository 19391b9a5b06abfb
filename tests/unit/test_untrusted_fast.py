"""The fast reader (orjson, then one walk) answers exactly as the reference reader (the
standard library with hooks) does: the same value, types and order included, or a refusal
with the same reason, whatever the bytes are."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.errors import DocumentInvalidError
from tasks.parse import untrusted


def outcome(read: Any, raw: bytes | str, **bounds: Any) -> tuple[str, Any]:
    try:
        return "ok", read(raw, max_bytes=1 << 20, **bounds)
    except DocumentInvalidError as exc:
        return "refused", exc.reason


def same(a: Any, b: Any) -> bool:
    """Equal with types: 1, 1.0 and True differ, so do 0.0 and -0.0, and key order."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, float):
            if not (x == y and math.copysign(1, x) == math.copysign(1, y)):
                return False
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif isinstance(x, dict):
            if list(x) != list(y):
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif x != y:
            return False
    return True


def check_agrees(raw: bytes | str, **bounds: Any) -> tuple[str, Any]:
    fast = outcome(untrusted.parse, raw, **bounds)
    reference = outcome(untrusted.parse_reference, raw, **bounds)
    assert fast[0] == reference[0], (raw[:200], fast, reference)
    if fast[0] == "ok":
        assert same(fast[1], reference[1]), (raw[:200], fast, reference)
    else:
        assert fast[1] == reference[1], (raw[:200], fast, reference)
    return fast


# --- documents with nasty leaves ---------------------------------------------------------

EDGE_INTS = [0, 1, -1, 2**53 + 1, 10**18, 2**63 - 2, 2**63 - 1, 2**63, 2**63 + 1,
             -(2**63) + 1, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 2**64 + 1, -(2**64),
             10**19, 10**20, 10**30, -(10**30)]
NUMBER_TEXTS = ["-0", "-0.0", "0.0", "-0e0", "0e0", "1E+2", "1e-2", "1e308",
                "1.7976931348623157e308", "1.7976931348623159e308", "1e400", "-1e400",
                "1e-400", "-1e-400", "5e-324", "2.4703282292062328e-324",
                "2.4703282292062327e-324", "1e19", "9.3e18", "-9.3e18", "9223372036854775807.0",
                "9223372036854775808e0", "18446744073709551616.5", "1" + "0" * 400,
                "0." + "0" * 400 + "1", "1" * 21, "-" + "9" * 20, "01", "1.", ".5", "+1", "1e",
                "-", "0x10", "1_0", "- 1"]
CONSTANTS = ["true", "false", "null", "NaN", "Infinity", "-Infinity", "nan", "tru", "nul"]
STRING_TEXTS = ['"\\ud800"', '"\\udfff"', '"\\ud83d\\ude00"', '"\\uD83D\\uDE00"',
                '"\\ud800\\u0041"', '"\\ud800\\ud800"', '"\\ude00\\ud83d"', '"\\u0000"',
                '"a\\u0000\\u0000b"', '"\\x41"', '"\\u00"', '"a\tb"', '"a\x00b"', '"\x7f"',
                '"\\/\\b\\f\\n\\r\\t\\"\\\\"', '"\ufeff"', '"\U0001f600"']
ALPHABET = st.one_of(st.sampled_from(["a", "\x00", "\ud800", "\udfff", "\ud83d", "\ude00", "é",
                                      "\U0001f600", "\n", '"', "\\", "\u2028", "\ufffd", "?",
                                      "[", "]", "{", "}", ",", ":", "0", "9"]),
                     st.characters())
TEXTS = st.text(ALPHABET, max_size=8)
DIGITS = st.text(st.sampled_from("0123456789"), min_size=1, max_size=25)


def _number(sign: str, whole: str, frac: str | None, exp: str | None) -> str:
    whole = whole.lstrip("0") or "0"
    return sign + whole + ("." + frac if frac else "") + ("e" + exp if exp else "")


NUMBERS = st.one_of(
    st.sampled_from(EDGE_INTS).map(str),
    st.integers().map(str),
    st.integers(-(2**66), 2**66).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.builds(_number, st.sampled_from(["", "-"]), DIGITS, st.none() | DIGITS,
              st.none() | st.builds(lambda s, n: s + str(n), st.sampled_from(["", "+", "-"]),
                                    st.integers(0, 420))),
    st.sampled_from(NUMBER_TEXTS),
)
STRINGS = st.one_of(
    st.builds(json.dumps, TEXTS, ensure_ascii=st.booleans()),
    st.sampled_from(STRING_TEXTS),
)
LEAVES = st.one_of(NUMBERS, STRINGS, st.sampled_from(CONSTANTS))
KEYS = st.one_of(st.sampled_from(['"a"', '"b"', '"a\\u0000"', '"a\\ufffd"', '"\\ud800"', '"?"',
                                  '""']), STRINGS)
SPACE = st.sampled_from(["", "", " ", "\n", "\t", "\r\n  ", "\x0c", "\xa0"])


def _array(parts: list[tuple[str, str]]) -> str:
    return "[" + ",".join(space + part for part, space in parts) + "]"


def _object(parts: list[tuple[str, str, str]]) -> str:
    return "{" + ",".join(f"{space}{key}{space}:{value}" for key, value, space in parts) + "}"


TREES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(st.tuples(inner, SPACE), max_size=5).map(_array),
        st.lists(st.tuples(KEYS, inner, SPACE), max_size=5).map(_object),
    ),
    max_leaves=25,
)


def _nest(text: str, depth: int, kind: str) -> str:
    if kind == "[":
        return "[" * depth + text + "]" * depth
    return '{"k":' * depth + text + "}" * depth


NESTED = st.builds(_nest, TREES,
                   st.sampled_from([0, 0, 0, 1, 2, 61, 62, 63, 64, 65, 255, 256, 257, 1000,
                                    1023, 1024, 1025]),
                   st.sampled_from(["[", "{"]))
NASTY_BYTES = [b"\xff", b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82",
               b"\x00", b",", b"]", b"}", b'"', b"\\", b"\xef\xbb\xbf", b" ", b"\x0c"]


@st.composite
def documents(draw: st.DrawFn) -> bytes | str:
    data = draw(NESTED).encode("utf-8", "surrogatepass")
    how = draw(st.sampled_from(["as is", "as is", "truncate", "insert", "replace", "bom",
                                "padded"]))
    if how == "truncate":
        data = data[:draw(st.integers(0, len(data)))]
    elif how in ("insert", "replace"):
        at = draw(st.integers(0, len(data)))
        cut = at + 1 if how == "replace" else at
        data = data[:at] + draw(st.sampled_from(NASTY_BYTES)) + data[cut:]
    elif how == "bom":
        data = b"\xef\xbb\xbf" + data
    elif how == "padded":
        data = draw(SPACE).encode() + data + draw(SPACE).encode()
    if draw(st.booleans()):
        return data
    return data.decode("utf-8", draw(st.sampled_from(["surrogateescape", "replace"])))


@given(documents(), st.sampled_from([untrusted.MAX_DEPTH] * 4 + [0, 1, 2, 3, 300, 2000]))
@settings(max_examples=1500, deadline=None)
def test_the_fast_reader_answers_as_the_reference_does(raw: bytes | str, max_depth: int) -> None:
    check_agrees(raw, max_depth=max_depth)


VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.sampled_from(EDGE_INTS), st.integers(),
              st.floats(allow_nan=False, allow_infinity=False), TEXTS),
    lambda inner: st.one_of(st.lists(inner, max_size=6),
                            st.dictionaries(TEXTS, inner, max_size=6)),
    max_leaves=40,
)


@given(VALUES, st.booleans(), st.booleans())
@settings(max_examples=500, deadline=None)
def test_encoded_values_read_the_same(value: Any, ascii_only: bool, as_text: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    check_agrees(text if as_text else text.encode("utf-8", "surrogatepass"))


# --- the known differences between orjson and the standard library ---------------------

REFUSED = ("refused",)


@pytest.mark.parametrize(("raw", "expected"), [
    # orjson reads integers up to 2**64-1, and floats past that; the reader refuses them.
    (b"9223372036854775807", 2**63 - 1),
    (b"-9223372036854775807", -(2**63) + 1),
    (b"9223372036854775808", ("refused", "number")),
    (b"-9223372036854775808", ("refused", "number")),
    (b"18446744073709551615", ("refused", "number")),
    (b"18446744073709551616", ("refused", "number")),
    (b"[1, -99999999999999999999999]", ("refused", "number")),
    ("1" * 25, ("refused", "number")),
    # Floats past 2**63 written as floats are kept, as the reference keeps them.
    (b"[1e19, 9.3e18, -9223372036854775808.0]", [1e19, 9.3e18, -9223372036854775808.0]),
    # orjson refuses infinities; both readers refuse them as numbers.
    (b"1e400", ("refused", "number")),
    (b'{"a": -1e400}', ("refused", "number")),
    (b"1.7976931348623159e308", ("refused", "number")),
    (b"NaN", ("refused", "number")),
    (b"[-Infinity]", ("refused", "number")),
    (b"1e-400", 0.0),
    (b"-0.0", -0.0),
    (b"-0e0", -0.0),
    (b"-0", 0),
    (b"1E2", 100.0),
    # orjson refuses lone surrogates; the reader keeps them as "?".
    (b'"\\ud800"', "?"),
    (b'["\\udfff", "\\ud800\\u0041", "\\ud83d\\ude00"]', ["?", "?A", "\U0001f600"]),
    (b'{"\\ud800": 1}', {"?": 1}),
    ('"\ud800"', "?"),
    # NUL becomes U+FFFD, in keys and values; keys that then collide keep the first place.
    (b'{"k\\u0000": ["a\\u0000b"]}', {"k\ufffd": ["a\ufffdb"]}),
    (b'{"a\\u0000": 1, "b": 2, "a\\ufffd": 3}', {"a\ufffd": 3, "b": 2}),
    # Duplicate keys: the last value, in the first key's place.
    (b'{"a": 1, "b": 2, "a": [3]}', {"a": [3], "b": 2}),
    # A duplicate key hides what it replaces from orjson's value, not from the reference.
    (b'{"a": 9223372036854775808, "a": 0}', ("refused", "number")),
    (b'{"a": [18446744073709551616], "a": 0}', ("refused", "number")),
    (b'{"a": "12:30", "a": 2**70, "a": 1}'.replace(b"2**70", str(2**70).encode()),
     ("refused", "number")),
    (b'{"a": "\\u003a", "b": 9223372036854775807, "b": 1}', {"a": ":", "b": 1}),
    (b'{"a": ' + b"[" * 1000 + b"]" * 1000 + b', "a": 0}', ("refused", "depth")),
    (b'{"a": ' + b"[" * 300 + b"]" * 300 + b', "a": 0}', {"a": 0}),
    (b'{"id": "12345678901234567890", "a": [1], "a": {"b": 2}}',
     {"id": "12345678901234567890", "a": {"b": 2}}),
    (b'{"u": "https://x", "a": 12345678901234567890, "a": 1}', ("refused", "number")),
    (b'{"a": "x:y", "a": "z", "n": "1234567890123456789012"}',
     {"a": "z", "n": "1234567890123456789012"}),
    (b'{"t": "12:30", "id": "1234567890123456789012", "x" : 1}',
     {"t": "12:30", "id": "1234567890123456789012", "x": 1}),
    (b'{"t": "a\\": b", "id": "1234567890123456789012"}',
     {"t": 'a": b', "id": "1234567890123456789012"}),
    # Depth counts containers, not scalars; the bound is inclusive.
    (b"[" * 64 + b"]" * 64, json.loads("[" * 64 + "]" * 64)),
    (b"[" * 65 + b"]" * 65, ("refused", "depth")),
    (b'{"a":' * 65 + b"1" + b"}" * 65, ("refused", "depth")),
    (b"[" * 1025 + b"]" * 1025, ("refused", "depth")),
    # Encoding and syntax.
    (b'"\xed\xa0\x80"', ("refused", "encoding")),
    (b"[1, \xff]", ("refused", "encoding")),
    (b"\xef\xbb\xbf[1]", ("refused", "syntax")),
    ("\ufeff[1]", ("refused", "syntax")),
    (b"[1,]", ("refused", "syntax")),
    (b'"a\tb"', ("refused", "syntax")),
    (b"\x0c[1]", ("refused", "syntax")),
    (b"", ("refused", "syntax")),
    (b" \t\r\n[1] \n", [1]),
    (b"[1e400, ", ("refused", "number")),  # the reference meets the number first
    (b"[" * 70 + b"1e400", ("refused", "number")),
])
def test_known_differences_are_answered_as_the_reference_does(raw: bytes | str,
                                                              expected: Any) -> None:
    got = check_agrees(raw)
    if isinstance(expected, tuple):
        assert got == expected
    else:
        assert got[0] == "ok" and same(got[1], expected), got


def test_deep_documents_are_refused_by_depth_at_any_bound() -> None:
    for max_depth in (0, 1, 5, 64, 300, 2000):
        for depth in (max_depth, max_depth + 1, 1000):
            check_agrees(b"[" * depth + b"]" * depth, max_depth=max_depth)


def test_an_ordinary_document_never_reaches_the_reference(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    def refuse(raw: bytes | str, max_depth: int) -> Any:
        raise AssertionError("the reference reader was asked")

    expected = {"rows": [{"id": i, "score": i / 7, "tags": ["a\u0000", "é"], "ok": None}
                         for i in range(50)], "big": 2**62, "deep": json.loads("[" * 63 + "]" * 63)}
    raw = json.dumps(expected).encode()
    reference = untrusted.parse_reference(raw, max_bytes=1 << 20)
    monkeypatch.setattr(untrusted, "_decode_reference", refuse)
    assert same(untrusted.parse(raw, max_bytes=1 << 20), reference)
    assert same(untrusted.parse(raw.decode(), max_bytes=1 << 20), reference)
    assert reference["rows"][0]["tags"][0] == "a\ufffd"


def test_without_orjson_the_reference_reads_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(untrusted, "_FAST_LOADS", None)
    assert untrusted.parse(b'{"a": [1, 2.5, "\\ud800"]}', max_bytes=100) == {
        "a": [1, 2.5, "?"]}
    with pytest.raises(DocumentInvalidError) as info:
        untrusted.parse(b"9223372036854775808", max_bytes=100)
    assert info.value.reason == "number"
