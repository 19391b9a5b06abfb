"""Checks on scalar arguments from app code and operators: names, ids, numbers.

Every layer that takes such a value from outside (admission, the policy and capacity
setters, queries, the CLI) checks it here, so a bad value raises the same coded
PlayrunError (INPUT_INVALID and its subclasses, RUN_NOT_FOUND) wherever it enters.
"""

from __future__ import annotations

import math
import re
from typing import Any

from tasks.constants import (
    FAIR_WEIGHT_MAX,
    MAX_DURATION_S,
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_LIST_RUNS,
    MAX_ORG_ID_CHARS,
    MAX_SQL_INT,
    MAX_STARTS_PER_MINUTE,
    RUN_ID_PATTERN,
)
from tasks.errors import InputInvalidError, PolicyInvalidError, RunNotFoundError

# NUL and lone surrogates: PostgreSQL text and JSONB refuse both, so they never get that far.
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# Names (org ids, keys, paths) also refuse the other control characters.
_BAD_NAME = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
RUN_ID = re.compile(RUN_ID_PATTERN)
# Operators' numbers: ASCII decimal only (no nan, inf, 1_000 or non-ASCII digits).
_MAX_NUMBER_TEXT = 64
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DIGITS = re.compile(r"[0-9]+")


def brief(value: Any, limit: int = 60) -> str:
    """A short, printable repr for error messages (never the whole of a huge value,
    and never a caller's own __repr__)."""
    if isinstance(value, (str, bytes)):
        text = repr(value[:limit + 1])
    elif isinstance(value, bool) or value is None:
        text = repr(value)
    elif isinstance(value, int):
        text = repr(int(value)) if abs(value) < 10**limit else f"<int of {value.bit_length()} bits>"
    elif isinstance(value, float):
        text = repr(float(value))
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


# --- names and ids -------------------------------------------------------------------


def check_text(value: Any, what: str, limit: int,
               error: type[InputInvalidError] = InputInvalidError) -> str:
    """A non-blank str of at most `limit` characters, without control characters,
    NUL or lone surrogates. Returns a plain str (a subclass is copied)."""
    if not isinstance(value, str):
        raise error(f"{what} must be a string, not {type(value).__name__}")
    if len(value) > limit:
        raise error(f"{what} is {len(value)} characters; the limit is {limit}")
    if not value.strip():
        raise error(f"{what} must be a non-empty string")
    if _BAD_NAME.search(value):
        raise error(f"{what} {brief(value)} holds a control character, NUL or lone surrogate")
    return str.__str__(value)


def check_note(value: Any, what: str, limit: int,
               error: type[InputInvalidError] = InputInvalidError) -> str:
    """Free text (an operator's reason): any characters PostgreSQL can store."""
    if not isinstance(value, str):
        raise error(f"{what} must be a string, not {type(value).__name__}")
    if len(value) > limit:
        raise error(f"{what} is {len(value)} characters; the limit is {limit}")
    if UNSTORABLE.search(value):
        raise error(f"{what} {brief(value)} holds NUL or a lone surrogate")
    return str.__str__(value)


def check_name(value: Any, what: str, limit: int) -> str:
    return check_text(value, what, limit)


def check_org_id(value: Any) -> str:
    return check_text(value, "org_id", MAX_ORG_ID_CHARS)


def check_idempotency_key(value: Any) -> str | None:
    return None if value is None else check_text(value, "idempotency_key",
                                                 MAX_IDEMPOTENCY_KEY_CHARS)


def check_run_id(value: Any) -> str:
    """Run ids are a UUID's 32 hex digits: anything else cannot name a run, so no query is made."""
    if not isinstance(value, str) or not RUN_ID.fullmatch(value):
        raise RunNotFoundError(f"no run with id {brief(value)}")
    return str.__str__(value)


# --- numbers from app code and operators ---------------------------------------------


def _real(value: Any, what: str, error: type[InputInvalidError]) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{what} must be a number, not {type(value).__name__}")
    try:
        f = float(value)
    except OverflowError as exc:  # an int past the float range
        raise error(f"{what} {brief(value)} is out of range") from exc
    if not math.isfinite(f):
        raise error(f"{what} must be finite, not {f!r}")
    return f


def check_seconds(value: Any, what: str, *, maximum: float = MAX_DURATION_S,
                  allow_zero: bool = False,
                  error: type[InputInvalidError] = InputInvalidError) -> float:
    """A finite number of seconds, positive (or zero if allowed), at most `maximum`."""
    f = _real(value, what, error)
    if f < 0 or (f == 0 and not allow_zero):
        raise error(f"{what} must be {'zero or more' if allow_zero else 'positive'}, "
                    f"not {f:g}")
    if f > maximum:
        raise error(f"{what} of {f:g}s is over the limit of {maximum:g}s")
    return f


def check_wait_timeout(timeout: Any) -> float | None:
    """RunHandle.wait: None waits for ever; otherwise finite seconds, zero or more."""
    if timeout is None:
        return None
    return check_seconds(timeout, "timeout", allow_zero=True)


def check_rate(value: Any) -> float:
    """A sandbox_starts_per_minute override: finite, 0 < rate <= MAX_STARTS_PER_MINUTE."""
    f = _real(value, "sandbox_starts_per_minute", PolicyInvalidError)
    if not 0 < f <= MAX_STARTS_PER_MINUTE:
        raise PolicyInvalidError(f"sandbox_starts_per_minute must be in "
                                 f"(0, {MAX_STARTS_PER_MINUTE:g}], not {f:g}; "
                                 f"use `policy hold` to stop starts")
    return f


def check_count(value: Any, what: str, *, minimum: int = 0,
                maximum: int = MAX_SQL_INT) -> int:
    """An int (not a bool) in [minimum, maximum]: by default what an Integer column holds."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputInvalidError(f"{what} must be an integer, not {type(value).__name__}")
    n = int(value)
    if not minimum <= n <= maximum:
        raise InputInvalidError(f"{what} must be between {minimum} and {maximum}, "
                                f"not {brief(n)}")
    return n


def check_list_limit(value: Any) -> int:
    return check_count(value, "limit", minimum=1, maximum=MAX_LIST_RUNS)


def parse_number(text: Any, what: str,
                 error: type[InputInvalidError] = InputInvalidError) -> float:
    """An operator's decimal number (`12`, `0.5`, `1e3`), finite; ranges are the caller's."""
    if (not isinstance(text, str) or len(text) > _MAX_NUMBER_TEXT
            or not _DECIMAL.fullmatch(text)):
        raise error(f"{what} {brief(text)} is not a decimal number")
    f = float(text)
    if not math.isfinite(f):  # 1e400
        raise error(f"{what} must be finite, not {brief(text)}")
    return f


def parse_count(text: Any, what: str) -> int:
    """An operator's whole number: decimal digits only (no sign, no exponent)."""
    if (not isinstance(text, str) or len(text) > _MAX_NUMBER_TEXT
            or not _DIGITS.fullmatch(text)):
        raise InputInvalidError(f"{what} {brief(text)} is not a whole number "
                                f"between 0 and {MAX_SQL_INT}")
    return check_count(int(text), what)


def check_weight(value: Any) -> int:
    """An org's share of the start rate: a whole number from 1 to FAIR_WEIGHT_MAX."""
    if isinstance(value, str):
        value = parse_count(value, "the weight")
    if isinstance(value, bool) or not isinstance(value, int) \
            or not 1 <= value <= FAIR_WEIGHT_MAX:
        raise InputInvalidError(f"the weight {brief(value)} is not a whole number "
                                f"between 1 and {FAIR_WEIGHT_MAX}")
    return value
