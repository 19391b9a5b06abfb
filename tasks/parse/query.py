"""Checks on the arguments of run listings and run-id prefixes (list_runs, resolve_run_id).

Same rules as tasks.admission.validate: a bad value raises a coded PlayrunError before
anything reaches SQL, and nothing malformed is rewritten.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tasks.constants import MAX_STATS_WINDOW_S, MIN_RUN_ID_PREFIX, RUN_CODE_PATTERN, RunStatus
from tasks.errors import InputInvalidError, RunNotFoundError
from tasks.parse.checks import brief, check_text
from tasks.parse.durations import parse_duration

_CODE = re.compile(RUN_CODE_PATTERN)
_STATUSES = frozenset(RunStatus)
_HEX_PREFIX = re.compile(r"[0-9a-f]{1,32}")
# A page cursor: the last run's created_at in microseconds since the epoch, and its id.
_CURSOR = re.compile(r"([0-9]{1,17})\.([0-9a-f]{32})")
# A duration ago: digits and units only, ending in a unit (an ISO time never does).
_AGO = re.compile(r"[0-9][0-9.dhms]*[dhms]")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Listings filter on times a database can hold and compare on every backend.
_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
_LATEST = datetime(9000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Cursor:
    """Where a page of runs (newest first) ended: the next page starts below it."""

    created_at: datetime
    run_id: str

    def text(self) -> str:
        delta = self.created_at.astimezone(UTC) - _EPOCH
        micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
        return f"{micros}.{self.run_id}"


def check_status(value: Any) -> RunStatus | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in _STATUSES:
        raise InputInvalidError(f"status {brief(value)} is not one of {', '.join(RunStatus)}")
    return RunStatus(value)


def check_code(value: Any) -> str | None:
    """A failure code: upper-case letters, digits and underscores (PLAY_ERROR, ...)."""
    if value is None:
        return None
    if not isinstance(value, str) or not _CODE.fullmatch(value):
        raise InputInvalidError(f"code {brief(value)} is not a code like PLAY_ERROR "
                                f"(A-Z, 0-9 and _, at most 64 characters)")
    return str.__str__(value)


def check_moment(value: Any, what: str) -> datetime | None:
    """A timezone-aware datetime between 2000 and 9000 (a naive one is ambiguous)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InputInvalidError(f"{what} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InputInvalidError(f"{what} must be timezone-aware (e.g. datetime.now(UTC))")
    moment = value.astimezone(UTC)
    if not _EARLIEST <= moment < _LATEST:
        raise InputInvalidError(f"{what} {moment.isoformat()} is outside 2000-9000")
    return moment


def parse_moment(text: Any, what: str, now: datetime | None = None) -> datetime | None:
    """An operator's time: an ISO 8601 time (UTC unless it names a zone), or a duration
    meaning that long ago (`90s`, `10m`, `1h30m`, `2d`). Empty text is no filter."""
    if text is None or text == "":
        return None
    text = check_text(text, what, 64)
    if _AGO.fullmatch(text):
        seconds = parse_duration(text, maximum=MAX_STATS_WINDOW_S)
        return check_moment((now or datetime.now(UTC)) - timedelta(seconds=seconds), what)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise InputInvalidError(f"{what} {brief(text)} is neither an ISO time "
                                f"(2026-12-01T10:00Z) nor a duration ago (1h)") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return check_moment(moment, what)


def check_cursor(value: Any) -> Cursor | None:
    if value is None:
        return None
    match = _CURSOR.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise InputInvalidError(f"page cursor {brief(value)} is not one a listing returned")
    moment = _EPOCH + timedelta(microseconds=int(match.group(1)))
    return Cursor(check_moment(moment, "page cursor") or moment, match.group(2))


def check_run_prefix(value: Any) -> str:
    """Lower-case hex, at least MIN_RUN_ID_PREFIX characters and at most a whole id."""
    if not isinstance(value, str) or not _HEX_PREFIX.fullmatch(value):
        raise RunNotFoundError(f"no run with id {brief(value)}")
    if len(value) < MIN_RUN_ID_PREFIX:
        raise InputInvalidError(f"run id prefix {value!r} is {len(value)} characters; "
                                f"give at least {MIN_RUN_ID_PREFIX}")
    return str.__str__(value)
