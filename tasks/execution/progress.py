"""Turn the runner's events file into `run.progress` ledger events, exactly once.

The byte offset consumed is stored on the attempt in the same transaction as the
events, so a redelivered or duplicated watcher never records a line twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.constants import MAX_EVENT_BYTES
from tasks.settlement.outcome import clean, strict_loads


@dataclass(frozen=True)
class Progress:
    message: str
    fields: dict[str, Any]


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
        try:
            doc = strict_loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        fields = doc.get("fields")
        found.append(Progress(clean(str(doc.get("message", ""))[:MAX_EVENT_BYTES]),
                              clean(fields) if isinstance(fields, dict) else {}))
    return found, end + 1
