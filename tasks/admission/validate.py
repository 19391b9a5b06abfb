"""Checks on what app code submits: the play file and the run's input.

A bad value raises a PlayrunError with a stable code (INPUT_INVALID, PLAY_NOT_FOUND,
PLAY_INVALID); nothing malformed is rewritten, and no input can make psycopg, json or
the recursion limit raise. Scalar arguments (names, ids, numbers) are checked in
tasks/parse/checks.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.constants import (
    MAX_INPUT_BYTES,
    MAX_INPUT_DEPTH,
    MAX_INPUT_FLOAT,
    MAX_INPUT_INT,
    MAX_PLAY_BYTES,
    MAX_PLAY_PATH_CHARS,
)
from tasks.errors import InputInvalidError, PlayInvalidError, PlayNotFoundError
from tasks.parse.checks import UNSTORABLE, brief, check_text

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


# Plays read before, by the identity of the file read: (path text, device, inode, size,
# mtime, ctime). Any write or rename changes ctime (no caller can set it), so a hit is
# the same bytes; only files whose times were settled before the read are kept (see
# _settled), and the cache is bounded in bytes (plays are up to MAX_PLAY_BYTES each).
_PlayKey = tuple[str, int, int, int, int, int]
_PLAY_CACHE_BYTES = 8 * 1024 * 1024
# A change within the filesystem's timestamp granularity (up to 2 s on some) could
# leave times as they were: a file whose times are that recent is read every time.
_SETTLED_NS = 2_000_000_000
_plays: OrderedDict[_PlayKey, tuple[PlaySource, int]] = OrderedDict()  # play, its bytes
_plays_bytes = 0
_plays_lock = threading.Lock()


def _play_key(text: str, st: os.stat_result) -> _PlayKey:
    return (text, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _cached_play(text: str) -> PlaySource | None:
    try:
        st = os.stat(text)
    except (OSError, ValueError):
        return None  # load_play reads it and says why
    if not stat.S_ISREG(st.st_mode):
        return None
    key = _play_key(text, st)
    with _plays_lock:
        found = _plays.get(key)
        if found is None:
            return None
        _plays.move_to_end(key)
        return found[0]


def _keep_play(key: _PlayKey, play: PlaySource, size: int, read_at_ns: int) -> None:
    global _plays_bytes
    if max(key[4], key[5]) >= read_at_ns - _SETTLED_NS or size > _PLAY_CACHE_BYTES // 4:
        return
    with _plays_lock:
        if key in _plays:
            return
        _plays[key] = (play, size)
        _plays_bytes += size
        while _plays_bytes > _PLAY_CACHE_BYTES:
            _plays_bytes -= _plays.popitem(last=False)[1][1]


def load_play(play: Any) -> PlaySource:
    text = check_play_path(play)
    cached = _cached_play(text)
    if cached is not None:
        return cached
    path = Path(text)
    read_at_ns = time.time_ns()
    try:
        if not path.is_file():
            raise PlayNotFoundError(f"play file {brief(text)} does not exist")
        with path.open("rb") as f:
            raw = f.read(MAX_PLAY_BYTES + 1)  # never more than the limit in memory
            st = os.fstat(f.fileno())  # after the read: a write during it shows in ctime
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
    loaded = PlaySource(text, source, hashlib.sha256(raw).hexdigest())
    if stat.S_ISREG(st.st_mode) and st.st_size == len(raw):
        _keep_play(_play_key(text, st), loaded, len(raw), read_at_ns)
    return loaded


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
    if UNSTORABLE.search(value):
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

