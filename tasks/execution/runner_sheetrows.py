"""Runtime sheet rows, checked in the sandbox before anything is sent: table names, row
keys, sizes, what the gateway could not store, and one row's outcome of the play's fn.

Standard library only; copied into each sandbox as playrun_sheetrows.py beside runner.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the host imports the runner's files as tasks.execution.*
    from tasks import protocol
else:  # in the sandbox they are flat files beside runner.py
    import playrun_protocol as protocol

TABLE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_KEY_BYTES = protocol.SHEET_MAX_KEY_BYTES
MAX_ROW_BYTES = protocol.SHEET_MAX_ROW_BYTES  # a row's data, and a row's result, as JSON
MAX_DEPTH = 60  # the gateway refuses documents nested deeper than 64 (with its envelope)
MAX_INT = 2**63 - 1
MAX_ERROR_CHARS = 4000

compact = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode


def size_of(text: str) -> int:
    return len(text.encode("utf-8", "replace"))


def unstorable(value: Any) -> str | None:
    """Why the gateway would refuse this JSON value (depth, integer range), or None."""
    if not isinstance(value, dict | list | tuple):
        big = isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT
        return "it holds an integer beyond 64 bits" if big else None
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth > MAX_DEPTH:
                return f"it is nested deeper than {MAX_DEPTH} levels"
            stack.extend(
                (v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)
            )
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_INT:
            return "it holds an integer beyond 64 bits"
    return None


def check_table(table: Any) -> str:
    if not isinstance(table, str) or not TABLE_RE.fullmatch(table):
        raise ValueError(
            f"a sheet table name is 1 to 64 letters, digits, '_', '-' or '.', "
            f"starting with a letter or digit; got {table!r:.80}"
        )
    return table


def row_key(row: Any, key: str, index: int) -> str:
    if not isinstance(row, dict):
        raise TypeError(f"row {index} is {type(row).__name__}, not an object (dict)")
    if key not in row:
        raise ValueError(f"row {index} has no key field {key!r}")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(
            f"row {index}: key field {key!r} must be a string or an integer, "
            f"not {type(value).__name__}"
        )
    text = str(value)
    if not text or "\x00" in text:
        raise ValueError(f"row {index}: key field {key!r} is empty or holds a NUL")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"row {index}: key field {key!r} is not valid text") from None
    if size > MAX_KEY_BYTES:
        raise ValueError(f"row {index}: key is {size} bytes; the limit is {MAX_KEY_BYTES}")
    return text


def outcome(fn: Callable[[Any], Any], row: dict[str, Any]) -> tuple[Any, str | None, int]:
    """fn(row) as (result, None, bytes) or (None, error, bytes): only the row fails, never
    the map. A result is returned as JSON stores it (tuples become lists), as on a wake."""
    try:
        value = fn(row)
    except Exception as exc:  # noqa: BLE001 - the row's error is its outcome
        try:
            text = f"{type(exc).__name__}: {exc}"
        except Exception:  # noqa: BLE001 - a broken __str__
            text = type(exc).__name__
        return None, text[:MAX_ERROR_CHARS], len(text)
    try:
        encoded = compact(value)
    except (TypeError, ValueError, RecursionError) as exc:
        text = f"the result is not JSON: {exc}"[:MAX_ERROR_CHARS]
        return None, text, len(text)
    size = size_of(encoded)
    if size > MAX_ROW_BYTES:
        return None, f"the result is {size} bytes; the limit is {MAX_ROW_BYTES}", 100
    problem = unstorable(value)
    if problem:
        return None, f"the result cannot be stored: {problem}", 100
    stored = json.loads(encoded) if isinstance(value, dict | list | tuple) else value
    return stored, None, size


def prepare(rows: Iterable[Any], key: str) -> tuple[list[Any], list[str], list[int]]:
    """The rows, their keys and sizes; every row checked before anything is sent."""
    items = list(rows)
    keys = [row_key(row, key, i) for i, row in enumerate(items)]
    first: dict[str, int] = {}
    for i, k in enumerate(keys):
        if k in first:
            raise ValueError(f"key {k[:80]!r} appears in rows {first[k]} and {i}")
        first[k] = i
    sizes = []
    for i, row in enumerate(items):
        try:
            size = size_of(compact(row))
        except (TypeError, ValueError, RecursionError) as exc:
            raise TypeError(f"row {i} is not JSON: {exc}") from None
        if size > MAX_ROW_BYTES:
            raise ValueError(f"row {i} is {size} bytes; the limit is {MAX_ROW_BYTES}")
        problem = unstorable(row)
        if problem:
            raise ValueError(f"row {i} cannot be stored: {problem}")
        sizes.append(size + len(keys[i]))
    return items, keys, sizes
