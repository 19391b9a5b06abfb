"""Time-ordered ids: valid UUIDv7, increasing within a process, sortable as text, and
accepted wherever a run id is (older v4 ids too)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from models import ids, new_id, new_task_id, uuid7
from models.ids import id_time_ms
from tasks.parse.checks import check_run_id
from tasks.parse.query import check_run_prefix


def test_ids_are_version_7_uuids_with_the_rfc_variant() -> None:
    for _ in range(1000):
        value = uuid7()
        assert value.version == 7 and value.variant == uuid.RFC_4122
        assert uuid.UUID(value.hex) == value


def test_ids_increase_within_a_process_and_sort_as_text() -> None:
    ids = [new_id() for _ in range(20_000)]  # several milliseconds, many per millisecond
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    tasks_ids = [new_task_id() for _ in range(1000)]
    assert tasks_ids == sorted(tasks_ids) and all(len(t) == 36 for t in tasks_ids)


def test_ids_from_threads_are_unique_and_each_thread_s_increase() -> None:
    out: dict[int, list[str]] = {}

    def make(n: int) -> None:
        out[n] = [new_id() for _ in range(5000)]

    threads = [threading.Thread(target=make, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(ids == sorted(ids) for ids in out.values())
    assert len({i for ids in out.values() for i in ids}) == 20_000


def test_an_id_carries_its_millisecond_and_later_ids_sort_after() -> None:
    before = time.time_ns() // 1_000_000
    first = new_id()
    assert before <= (id_time_ms(first) or 0) <= time.time_ns() // 1_000_000 + 1
    assert new_id() > first
    assert id_time_ms(uuid.uuid4().hex) is None


def test_new_and_old_ids_pass_the_run_id_checks() -> None:
    for run_id in (new_id(), uuid.uuid4().hex):
        assert check_run_id(run_id) == run_id
        assert check_run_prefix(run_id[:16]) == run_id[:16]


def test_ids_keep_increasing_when_the_clock_steps_back_or_a_millisecond_overflows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [time.time_ns() + 10**12]  # ahead of every id made so far

    monkeypatch.setattr(ids.time, "time_ns", lambda: now[0])
    made = [new_id() for _ in range(5000)]  # one millisecond: the counter overflows
    now[0] -= 5 * 10**9  # the clock steps back five seconds
    made += [new_id() for _ in range(10)]
    assert made == sorted(made) and len(set(made)) == len(made)
    assert id_time_ms(made[-1]) == now[0] // 10**6 + 5000 + 1  # borrowed, then kept
