"""The oracle of the validation tests: what docs/contract.md calls a valid argument or
input, written apart from the code it checks (tasks/admission/validate.py)."""

from __future__ import annotations

import json
from typing import Any

INT64 = 2**63
MAX_BYTES = 256 * 1024  # tasks.constants.MAX_INPUT_BYTES, restated as the contract


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


# --- the oracle: what docs/contract.md calls valid, written apart from the code ---------

def valid_name(value: Any, limit: int) -> bool:
    return (type(value) is str and 0 < len(value) <= limit and value.strip() != ""
            and not any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF
                        for c in value))


def valid_json(value: Any, depth: int = 0) -> bool:
    if value is None or type(value) is bool:
        return True
    if type(value) is int:
        return abs(value) < INT64
    if type(value) is float:
        return abs(value) < 1e16  # larger come back from JSONB as ints; NaN compares False
    if type(value) is str:
        return not any(c == "\x00" or 0xD800 <= ord(c) <= 0xDFFF for c in value)
    if type(value) is list:
        return depth < 64 and all(valid_json(v, depth + 1) for v in value)
    if type(value) is dict:
        return depth < 64 and all(type(k) is str and valid_json(k) and valid_json(v, depth + 1)
                                  for k, v in value.items())
    return False


def valid_input(value: Any) -> bool:
    if not valid_json(value):
        return False
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()) <= MAX_BYTES
