"""Parse operator durations such as `90s`, `10m`, `1h30m`, `2d`."""

from __future__ import annotations

import re

from tasks.errors import PlayrunError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


class DurationInvalidError(PlayrunError):
    """The duration is not like 30s, 10m, 1h30m or 2d."""

    code = "DURATION_INVALID"


def parse_duration(text: str) -> float:
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    else:
        parts = _PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise DurationInvalidError(f"cannot read duration {text!r}; use e.g. 30s, 10m, 1h")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise DurationInvalidError("the duration must be positive")
    return seconds
