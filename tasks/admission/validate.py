"""Checks made before anything is written: the play file, the input, the org id."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.constants import MAX_INPUT_BYTES, MAX_PLAY_BYTES
from tasks.errors import InputInvalidError, PlayInvalidError, PlayNotFoundError


@dataclass(frozen=True)
class PlaySource:
    path: str
    source: str
    digest: str


def load_play(play: str | Path) -> PlaySource:
    path = Path(play)
    if not path.is_file():
        raise PlayNotFoundError(f"play file {str(play)!r} does not exist")
    raw = path.read_bytes()
    if len(raw) > MAX_PLAY_BYTES:
        raise PlayInvalidError(f"play file is {len(raw)} bytes; the limit is {MAX_PLAY_BYTES}")
    try:
        source = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlayInvalidError(f"play file is not UTF-8: {exc}") from exc
    return PlaySource(str(play), source, hashlib.sha256(raw).hexdigest())


def check_input(value: Any) -> Any:
    """The input must be JSON (no NaN) and at most MAX_INPUT_BYTES once encoded."""
    try:
        encoded = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InputInvalidError(f"input is not JSON: {exc}") from exc
    if len(encoded.encode()) > MAX_INPUT_BYTES:
        raise InputInvalidError(
            f"input is {len(encoded.encode())} bytes of JSON; the limit is {MAX_INPUT_BYTES}"
        )
    return json.loads(encoded)


def parse_input_text(text: str) -> Any:
    """For the CLI: `--input` is JSON text."""
    try:
        return check_input(json.loads(text))
    except json.JSONDecodeError as exc:
        raise InputInvalidError(f"input is not JSON: {exc}") from exc


def check_name(value: str, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise InputInvalidError(f"{what} must be a non-empty string of at most {limit} characters")
    return value
