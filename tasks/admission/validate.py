"""Every check on untrusted arguments, made before anything reaches SQL.

App code (submit_run, get_run, cancel_run, run_events, list_runs, RunHandle.wait)
and operators (the CLI, the policy and capacity setters) pass values through
here. A bad value raises a PlayrunError with a stable code (INPUT_INVALID and
its subclasses, RUN_NOT_FOUND, PLAY_NOT_FOUND, PLAY_INVALID); nothing malformed
is rewritten, and no value can make psycopg, json or the recursion limit raise.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.constants import (
    MAX_DURATION_S,
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_INPUT_BYTES,
    MAX_INPUT_DEPTH,
    MAX_INPUT_FLOAT,
    MAX_INPUT_INT,
    MAX_LIST_RUNS,
    MAX_ORG_ID_CHARS,
    MAX_PLAY_BYTES,
    MAX_PLAY_PATH_CHARS,
    MAX_SQL_INT,
    MAX_STARTS_PER_MINUTE,
    RUN_ID_PATTERN,
)
from tasks.errors import (
    InputInvalidError,
    PlayInvalidError,
    PlayNotFoundError,
    PolicyInvalidError,
    RunNotFoundError,
)

# NUL and lone surrogates: PostgreSQL text and JSONB refuse both, so they never get that far.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# Names (org ids, keys, paths) also refuse the other control characters.
_BAD_NAME = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
_RUN_ID = re.compile(RUN_ID_PATTERN)
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
    if _UNSTORABLE.search(value):
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
    """Run ids are uuid4().hex: anything else cannot name a run, so no query is made."""
    if not isinstance(value, str) or not _RUN_ID.fullmatch(value):
        raise RunNotFoundError(f"no run with id {brief(value)}")
    return str.__str__(value)


# --- plays ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlaySource:
    path: str
    source: str
    digest: str


def check_play_path(play: Any) -> str:
    if isinstance(play, os.PathLike) and not isinstance(play, bytes):
        play = os.fspath(play)
    if not isinstance(play, str):
        raise InputInvalidError(f"the play must be a path (str or Path), not {type(play).__name__}")
    return check_text(play, "play path", MAX_PLAY_PATH_CHARS)


def load_play(play: Any) -> PlaySource:
    text = check_play_path(play)
    path = Path(text)
    try:
        if not path.is_file():
            raise PlayNotFoundError(f"play file {brief(text)} does not exist")
        with path.open("rb") as f:
            raw = f.read(MAX_PLAY_BYTES + 1)  # never more than the limit in memory
    except OSError as exc:  # unreadable, a name too long for the filesystem, ...
        raise PlayNotFoundError(f"play file {brief(text)} cannot be read: "
                                f"{exc.strerror or type(exc).__name__}") from exc
    if len(raw) > MAX_PLAY_BYTES:
        raise PlayInvalidError(f"play file is over {MAX_PLAY_BYTES} bytes; "
                               f"the limit is {MAX_PLAY_BYTES}")
    try:
        source = raw.decode("utf-8")  # strict: no lone surrogates can come out of this
    except UnicodeDecodeError as exc:
        raise PlayInvalidError(f"play file is not UTF-8: {exc}") from exc
    if "\x00" in source:
        raise PlayInvalidError("play file holds a NUL byte; a Python source cannot")
    return PlaySource(text, source, hashlib.sha256(raw).hexdigest())


# --- run input -----------------------------------------------------------------------


class _Budget:
    """A lower bound on the encoded size, spent while walking, so a huge value is
    refused after reading at most about MAX_INPUT_BYTES of it."""

    def __init__(self) -> None:
        self.left = MAX_INPUT_BYTES

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise InputInvalidError(f"input is over {MAX_INPUT_BYTES} bytes of JSON; "
                                    f"the limit is {MAX_INPUT_BYTES}")


def _input_text(value: str, budget: _Budget) -> str:
    budget.spend(len(value) + 2)
    if _UNSTORABLE.search(value):
        raise InputInvalidError(
            f"input string {brief(value)} holds NUL or a lone surrogate (not storable as JSON)")
    return str.__str__(value)


def _plain(value: Any, depth: int, budget: _Budget) -> Any:
    """A plain JSON copy of `value` (dict, list, str, int, float, bool, None), or raise."""
    if value is None or isinstance(value, bool):
        budget.spend(4)
        return None if value is None else bool(value)
    if isinstance(value, int):
        n = int(value)
        if not -MAX_INPUT_INT < n < MAX_INPUT_INT:
            raise InputInvalidError(f"input integer {brief(n)} is outside +-2**63")
        budget.spend(1)
        return n
    if isinstance(value, float):
        f = float(value)
        if not math.isfinite(f):
            raise InputInvalidError(f"input number {f!r} is not finite (not JSON)")
        if not -MAX_INPUT_FLOAT < f < MAX_INPUT_FLOAT:
            raise InputInvalidError(
                f"input float {f!r} is 1e16 or more in size: the database would hand it back "
                f"as an integer; send an int or a string")
        budget.spend(1)
        return f
    if isinstance(value, str):
        return _input_text(value, budget)
    if isinstance(value, (list, tuple, dict)) and depth >= MAX_INPUT_DEPTH:
        raise InputInvalidError(f"input is nested more than {MAX_INPUT_DEPTH} levels deep")
    if isinstance(value, (list, tuple)):
        budget.spend(2)
        items = []
        for item in value:
            items.append(_plain(item, depth + 1, budget))
            budget.spend(1)
        return items
    if isinstance(value, dict):
        budget.spend(2)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InputInvalidError(
                    f"input object keys must be strings, not {type(key).__name__}")
            out[_input_text(key, budget)] = _plain(item, depth + 1, budget)
            budget.spend(2)
        return out
    raise InputInvalidError(f"input holds a {type(value).__name__}, which is not JSON")


def check_input(value: Any) -> Any:
    """A plain-JSON copy of the input: no NaN/Infinity, ints within +-2**63, floats
    within +-1e16 (so each survives JSONB as itself), nesting at
    most MAX_INPUT_DEPTH, strings without NUL or lone surrogates, string keys, and at
    most MAX_INPUT_BYTES once encoded as compact UTF-8 JSON."""
    plain = _plain(value, 0, _Budget())
    size = len(json.dumps(plain, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode())
    if size > MAX_INPUT_BYTES:
        raise InputInvalidError(f"input is {size} bytes of JSON; the limit is {MAX_INPUT_BYTES}")
    return plain


def _refuse_constant(name: str) -> Any:
    raise InputInvalidError(f"input holds {name}, which is not JSON")


def parse_input_text(text: Any) -> Any:
    """For the CLI: `--input` is JSON text."""
    if not isinstance(text, str):
        raise InputInvalidError(f"input text must be a string, not {type(text).__name__}")
    if len(text) > 4 * MAX_INPUT_BYTES:  # room for indentation; check_input has the last word
        raise InputInvalidError(f"input text is {len(text)} characters; "
                                f"the limit is {MAX_INPUT_BYTES} bytes of JSON")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError as exc:
        raise InputInvalidError(
            f"input is nested more than {MAX_INPUT_DEPTH} levels deep") from exc
    except ValueError as exc:  # JSONDecodeError, or an integer of too many digits
        raise InputInvalidError(f"input is not JSON: {exc}") from exc
    return check_input(value)


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
