"""Time-ordered ids (UUIDv7, RFC 9562), made in the process that writes the row.

Layout: 48 bits of Unix milliseconds, the version (7), a 12-bit counter, the variant and
62 random bits. The counter starts at a random value in its lower half each millisecond
and counts up within it, so ids one process makes sort in the order it made them; when
the clock stands still or steps back, the last millisecond is kept and the counter goes
on (borrowing the next millisecond if it overflows). Ids from different processes sort by
time to the millisecond. Rows written close together land on the same index pages
instead of anywhere in the index (docs/design.md#time-ordered-ids).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable

_COUNTER_MAX = 0xFFF
_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> uuid.UUID:
    """A UUIDv7, greater than every other this process made before."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms, _counter = ms, int.from_bytes(os.urandom(2), "big") & 0x7FF
        elif _counter < _COUNTER_MAX:
            _counter += 1
        else:  # 4,096 ids in one millisecond: take the next one early
            _last_ms, _counter = _last_ms + 1, 0
        ms, counter = _last_ms, _counter
    rand = int.from_bytes(os.urandom(8), "big") & 0x3FFF_FFFF_FFFF_FFFF
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand
    return uuid.UUID(int=value)


def _reset_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a child must not inherit a lock held by another thread


os.register_at_fork(after_in_child=_reset_after_fork)

# What new_id draws from; bench/bench_scale.py swaps in uuid.uuid4 for its baseline.
source: Callable[[], uuid.UUID] = uuid7


def new_id() -> str:
    """A row id: 32 lower-case hex digits (a UUID without dashes), time-ordered."""
    return source().hex


def new_task_id() -> str:
    """An outbox row's id, which is also its Celery task id: a dashed, time-ordered UUID."""
    return str(source())


def id_time_ms(row_id: str) -> int | None:
    """When a time-ordered id was made (Unix ms); None for an older random (v4) id."""
    value = uuid.UUID(row_id)
    return value.int >> 80 if value.version == 7 else None
