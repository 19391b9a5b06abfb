"""Turn the runner's events file into `run.progress` ledger events, exactly once.

The byte offset consumed is stored on the attempt in the same transaction as the
events, so a redelivered or duplicated watcher never records a line twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks import untrusted
from tasks.constants import MAX_EVENT_BYTES
from tasks.errors import DocumentInvalidError


@dataclass(frozen=True)
class Progress:
    message: str
    fields: dict[str, Any]


def parse_event(line: bytes) -> Progress | None:
    """One progress line; an unusable one is kept as a note, so nothing vanishes unsaid."""
    try:
        doc = untrusted.parse(line, max_bytes=MAX_EVENT_BYTES * 2)
    except DocumentInvalidError as exc:
        return Progress("[a progress line was dropped]", {"reason": exc.reason})
    if not isinstance(doc, dict):
        return Progress("[a progress line was dropped]", {"reason": "type"})
    message = doc.get("message", "")
    fields = doc.get("fields")
    return Progress(str(message)[:MAX_EVENT_BYTES] if isinstance(message, str) else "",
                    fields if isinstance(fields, dict) else {})


def parse_lines(chunk: bytes) -> tuple[list[Progress], int]:
    """Parse whole lines from chunk; return them and how many bytes they used."""
    end = chunk.rfind(b"\n")
    if end < 0:
        # One line longer than the read window: skip it rather than stall forever.
        return ([Progress("[an over-long progress line was dropped]", {})], len(chunk)) \
            if len(chunk) >= MAX_EVENT_BYTES * 4 else ([], 0)
    found: list[Progress] = []
    for line in chunk[: end + 1].splitlines():
        if not line.strip():
            continue
        progress = parse_event(line)
        if progress is not None:
            found.append(progress)
    return found, end + 1
