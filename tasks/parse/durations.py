"""Parse operator durations such as `90s`, `10m`, `1h30m`, `2d`.

Each unit appears at most once, in the order d, h, m, s (`1d2h3m4s`); a bare
number is seconds. The result is positive, finite and at most `maximum`
(by default MAX_DURATION_S, one year), so it always fits a database interval.
"""

from __future__ import annotations

import re
from typing import Any

from tasks.constants import MAX_DURATION_S
from tasks.errors import DurationInvalidError
from tasks.parse.checks import brief, check_seconds

__all__ = ["DurationInvalidError", "parse_duration"]

_NUM = r"[0-9]{1,9}(?:\.[0-9]{1,9})?"
_DURATION = re.compile(
    rf"(?:(?P<d>{_NUM})d)?(?:(?P<h>{_NUM})h)?(?:(?P<m>{_NUM})m)?(?:(?P<s>{_NUM})s)?")
_BARE = re.compile(_NUM)
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_MAX_TEXT = 64


def parse_duration(text: Any, *, maximum: float = MAX_DURATION_S) -> float:
    if not isinstance(text, str) or len(text) > _MAX_TEXT:
        raise DurationInvalidError(f"cannot read duration {brief(text)}; use e.g. 30s, 10m, 1h")
    text = text.strip().lower()
    if _BARE.fullmatch(text):
        seconds = float(text)
    else:
        match = _DURATION.fullmatch(text)
        if match is None or not any(match.groupdict().values()):
            raise DurationInvalidError(
                f"cannot read duration {brief(text)}; use e.g. 30s, 10m, 1h30m, 2d "
                f"(each unit once, in the order d h m s)")
        seconds = sum(float(n) * _UNITS[u] for u, n in match.groupdict().items() if n)
    return check_seconds(seconds, "duration", maximum=maximum, error=DurationInvalidError)
