"""The one reader of documents that come from sandboxes (result files, progress lines,
bodies pushed to the gateway): strict JSON, bounded, and storable everywhere.

Anything a play can write is hostile input. `parse` either returns a value that
PostgreSQL's JSONB, SQLite and Python all store and read back unchanged, or raises
DocumentInvalidError; it never raises anything else, whatever the bytes are.
"""

from __future__ import annotations

import json
import math
import re
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


def parse(raw: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH,
          max_values: int | None = None) -> Any:
    """Decode one JSON document from a sandbox; see the module docstring. `max_values`
    bounds its structure (structure_count) before it is decoded."""
    size = len(raw)
    if size > max_bytes:
        raise DocumentInvalidError(f"the document is {size} bytes; the limit is {max_bytes}",
                                   reason="size")
    if max_values is not None:
        _check_cost(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw,
                    max_values)
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


def encoded_size(value: Any) -> int:
    """Bytes of the compact JSON encoding of a value that `storable` accepted."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
