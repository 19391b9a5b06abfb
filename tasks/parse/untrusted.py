"""The one reader of documents that come from sandboxes (result files, progress lines,
bodies pushed to the gateway): strict JSON, bounded, and storable everywhere.

Anything a play can write is hostile input. `parse` either returns a value that
PostgreSQL's JSONB, SQLite and Python all store and read back unchanged, or raises
DocumentInvalidError; it never raises anything else, whatever the bytes are.

`parse_reference` is the definition: the standard library's decoder with hooks, then
`storable`. `parse` answers exactly as it does, faster: orjson decodes, one walk checks
what orjson reads differently (integers past the signed 64-bit range, depth), and any
document orjson refuses, or the walk doubts, is read by the reference instead.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from itertools import chain, compress, repeat
from operator import is_
from typing import Any

from tasks.errors import DocumentInvalidError

# Deeper than this is refused: PostgreSQL's JSONB and Python's recursion both give out
# somewhere in the thousands, and no honest play output needs more.
MAX_DEPTH = 64
# Integers beyond a signed 64-bit range do not survive every JSON consumer of the ledger.
MAX_INT = 2**63 - 1


# A JSON string, escapes included: what is inside one is never structure.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_STRUCTURE = (b"[", b"{", b",", b":")


def _structure(raw: bytes) -> int:
    return sum(raw.count(token) for token in _STRUCTURE)


def structure_count(raw: bytes) -> int:
    """Brackets, braces, commas and colons outside strings: what decoding costs per value,
    counted at C speed before any value is built."""
    return _structure(_STRING.sub(b'""', raw))


def _check_cost(raw: bytes, max_values: int) -> None:
    # The plain count is an upper bound (it counts inside strings too): most documents
    # stop there; only a suspect one pays for the exact count.
    if _structure(raw) > max_values and structure_count(raw) > max_values:
        raise DocumentInvalidError(f"the document has more than {max_values} values",
                                   reason="values")


def _refuse_constant(name: str) -> Any:
    raise DocumentInvalidError(f"{name} is not JSON", reason="number")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise DocumentInvalidError(f"the number {text[:40]} is out of range", reason="number")
    return value


def _parse_int(text: str) -> int:
    if len(text) > 20:
        raise DocumentInvalidError(f"the integer {text[:40]}... is out of range", reason="number")
    value = int(text)
    if abs(value) > MAX_INT:
        raise DocumentInvalidError(f"the integer {text} is out of range", reason="number")
    return value


def storable_text(text: str) -> str:
    """PostgreSQL refuses NUL in text and JSONB, and nothing stores a lone surrogate."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _leaf(value: Any) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            raise DocumentInvalidError("an integer is out of range", reason="number")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DocumentInvalidError("a number is not finite", reason="number")
        return value
    raise DocumentInvalidError(f"{type(value).__name__} is not JSON", reason="type")


def storable(value: Any, *, max_depth: int = MAX_DEPTH) -> Any:
    """A copy of an already-decoded value made storable, or DocumentInvalidError.

    Iterative, so a hostile depth cannot exhaust Python's stack before it is counted.
    """
    if not isinstance(value, dict | list):
        return _leaf(value)
    root: list[Any] = [None]
    # (source container, target container, key in parent target, depth)
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 1)]
    while stack:
        source, parent, slot, depth = stack.pop()
        if depth > max_depth:
            raise DocumentInvalidError(f"nested deeper than {max_depth} levels", reason="depth")
        if isinstance(source, dict):
            target: Any = {}
            for key, item in source.items():
                if not isinstance(key, str):
                    raise DocumentInvalidError("an object key is not a string", reason="type")
                name = storable_text(key)
                if isinstance(item, dict | list):
                    target[name] = None
                    stack.append((item, target, name, depth + 1))
                else:
                    target[name] = _leaf(item)
        else:
            target = [None] * len(source)
            for index, item in enumerate(source):
                if isinstance(item, dict | list):
                    stack.append((item, target, index, depth + 1))
                else:
                    target[index] = _leaf(item)
        parent[slot] = target
    return root[0]


def _admit(raw: bytes | str, max_bytes: int, max_values: int | None) -> None:
    size = len(raw)
    if size > max_bytes:
        raise DocumentInvalidError(f"the document is {size} bytes; the limit is {max_bytes}",
                                   reason="size")
    if max_values is not None:
        _check_cost(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw,
                    max_values)


def _decode_reference(raw: bytes | str, max_depth: int) -> Any:
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentInvalidError(f"the document is not UTF-8: {exc}",
                                       reason="encoding") from None
    else:
        text = raw
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_parse_float,
                           parse_int=_parse_int)
    except DocumentInvalidError:
        raise
    except RecursionError:
        raise DocumentInvalidError(f"nested deeper than {max_depth} levels",
                                   reason="depth") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
        raise DocumentInvalidError(f"the document is not JSON: {str(exc)[:200]}",
                                   reason="syntax") from None
    return storable(value, max_depth=max_depth)


def parse_reference(raw: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH,
                    max_values: int | None = None) -> Any:
    """`parse` on the standard library alone: the answer `parse` must give for any input."""
    _admit(raw, max_bytes, max_values)
    return _decode_reference(raw, max_depth)


def _orjson_loads() -> Callable[[bytes | str], Any] | None:
    try:
        import orjson
    except ImportError:  # the reference reader answers alone
        return None
    return orjson.loads


_FAST_LOADS = _orjson_loads()
# Deeper, the reference's answer hangs on the interpreter's recursion limit: it gives it.
_WALK_DEPTH = 256
_BIG = 2.0**63


def _shape_table() -> bytes:
    table = bytearray(b"x" * 256)
    for byte in b"0123456789":
        table[byte] = ord("0")
    for byte in b" \t\n\r":
        table[byte] = ord(" ")
    table[ord("[")] = table[ord("{")] = ord("[")
    table[ord('"')], table[ord(":")] = ord('"'), ord(":")
    return bytes(table)


# The text's bytes by class, in one C pass: digits, whitespace, openers, quotes, colons.
_SHAPE = _shape_table()
# Integers past MAX_INT, and those orjson reads as floats (past 64 bits), take 19 digits.
_LONG_RUN = b"0" * 19


def _walk(value: Any, limit: int, numbers: bool, strings: bool) -> tuple[int, int] | None:
    """None if the reference could read `value` otherwise: deeper than `limit` or, when
    `numbers`, an integer past MAX_INT or a float that may be one past 64 bits. Else its
    keys, and (when `strings`) the colons inside its strings. Level by level, so the
    per-value work runs in C."""
    items = [value]
    depth = keys = colons = 0
    while True:
        kinds = list(map(type, items))
        present = set(kinds)
        if numbers and int in present:
            ints = list(compress(items, map(is_, kinds, repeat(int))))
            if max(ints) > MAX_INT or min(ints) < -MAX_INT:
                return None
        if numbers and float in present:
            floats = list(compress(items, map(is_, kinds, repeat(float))))
            if not (max(floats) < _BIG and min(floats) > -_BIG and math.isfinite(sum(floats))):
                return None
        dicts = list(compress(items, map(is_, kinds, repeat(dict)))) if dict in present else []
        lists = list(compress(items, map(is_, kinds, repeat(list)))) if list in present else []
        keys += sum(map(len, dicts))
        if strings:
            texts = compress(items, map(is_, kinds, repeat(str))) if str in present else ()
            colons += "".join(chain(texts, chain.from_iterable(dicts))).count(":")
        if not dicts and not lists:
            return keys, colons
        depth += 1
        if depth > limit:
            return None
        items = list(chain(chain.from_iterable(map(dict.values, dicts)),
                           chain.from_iterable(lists)))


def _none_dropped(data: bytes, shape: bytes, value: Any, keys: int) -> bool:
    """Whether the text has no pair beyond the `keys` read: no duplicate key dropped one."""
    # Upper bounds on the pairs: all colons, then those after a quote or whitespace.
    colons = shape.count(b":")
    if colons == keys or shape.count(b'":') + shape.count(b" :") == keys:
        return True
    # Exactly: the colons are the keys' plus those inside strings, unless one is escaped.
    if b"\\u003a" in data or b"\\u003A" in data:
        return False
    counted = _walk(value, _WALK_DEPTH, False, True)
    return counted is not None and colons == sum(counted)


def _fast(raw: bytes | str, value: Any, max_depth: int) -> tuple[bool, Any]:
    """orjson's value as the reference would return it, or (False, None) to ask the reference."""
    data = raw if isinstance(raw, bytes) else raw.encode()  # orjson read it: no lone surrogate
    shape = data.translate(_SHAPE)
    limit = min(max_depth, _WALK_DEPTH)
    numbers = _LONG_RUN in shape
    openers = shape.count(b"[")
    if numbers or openers > limit:
        counted = _walk(value, limit, numbers, False)
        if counted is None:
            return False, None
        # A duplicate key hides what it replaces from the walk, not from the reference's hooks.
        hidden = numbers or openers > _WALK_DEPTH
        if hidden and not _none_dropped(data, shape, value, counted[0]):
            return False, None
    # Only an escaped NUL needs storable's copy: orjson refuses lone surrogates.
    return True, storable(value, max_depth=max_depth) if b"\\u0000" in data else value


def parse(raw: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH,
          max_values: int | None = None) -> Any:
    """Decode one JSON document from a sandbox; see the module docstring. `max_values`
    bounds its structure (structure_count) before it is decoded."""
    _admit(raw, max_bytes, max_values)
    if _FAST_LOADS is not None and isinstance(raw, bytes | str):
        try:
            value = _FAST_LOADS(raw)
        except (ValueError, TypeError):  # orjson.JSONDecodeError is a ValueError
            pass  # a refusal, or a form orjson reads differently: the reference answers
        else:
            done, result = _fast(raw, value, max_depth)
            if done:
                return result
            del value, result  # not held while the reference builds its own
    return _decode_reference(raw, max_depth)


def encoded_size(value: Any) -> int:
    """Bytes of the compact JSON encoding of a value that `storable` accepted."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
