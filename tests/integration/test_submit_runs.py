"""submit_runs: many runs in one transaction, idempotent per run, refused whole on a bad item;
the start messages reach real workers; the relay never holds SQLite's write lock to publish."""

from __future__ import annotations

import json
import math
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis
import sqlalchemy as sa

import tasks
from models import Outbox, Run, RunEvent
from tasks.admission import relay
from tasks.admission.submit import admit
from tasks.broker import lean
from tasks.broker.app import app
from tasks.broker.publish import Message, StubPublisher, use
from tasks.constants import QUEUE, TASK_START_ATTEMPT
from tasks.errors import PlayrunError
from tasks.store.db import session_scope
from tests.support.paths import ROOT
from tests.support.stack import Worker

NOOP = ROOT / "examples" / "plays" / "noop.py"
HELLO = ROOT / "examples" / "plays" / "hello.py"


def org() -> str:
    return f"batch-{uuid.uuid4().hex[:8]}"


def runs_of(org_id: str) -> list[tuple[str, str | None, Any]]:
    with session_scope(readonly=True) as s:
        return [tuple(r) for r in s.execute(
            sa.select(Run.id, Run.idempotency_key, Run.input).where(Run.org_id == org_id)
            .order_by(Run.created_at, Run.id))]


def rows_of(org_id: str) -> tuple[int, int, int]:
    """(runs, admitted events, outbox rows) of an org."""
    with session_scope(readonly=True) as s:
        ids = sa.select(Run.id).where(Run.org_id == org_id)
        return (len(runs_of(org_id)),
                int(s.scalar(sa.select(sa.func.count()).select_from(RunEvent)
                             .where(RunEvent.run_id.in_(ids), RunEvent.kind == "run.admitted"))
                    or 0),
                int(s.scalar(sa.select(sa.func.count()).select_from(Outbox)
                             .where(Outbox.run_id.in_(ids))) or 0))


# --- end to end on PostgreSQL ----------------------------------------------------------


def test_a_batch_runs_end_to_end_in_order(worker: Worker) -> None:
    o = org()
    items = [{"play": HELLO, "input": {"name": f"n{i}"}, "org_id": o,
              "idempotency_key": f"k{i}"} for i in range(20)]
    handles = tasks.submit_runs(items)
    assert len(handles) == 20 and all(h.created for h in handles)
    results = [h.wait(timeout=90) for h in handles]
    assert [(r.status, r.code, r.error) for r in results] == [("succeeded", None, None)] * 20
    assert [r.output["greeting"] for r in results] == [f"Hello, n{i}!" for i in range(20)]
    first = tasks.run_events(handles[0].id)[0]
    assert first.kind == "run.admitted" and first.data["idempotency_key"] == "k0"
    assert sorted(key or "" for _, key, _ in runs_of(o)) == sorted(f"k{i}" for i in range(20))
    assert all([e.kind for e in tasks.run_events(h.id)].count("run.admitted") == 1
               for h in handles)


def test_a_single_submit_and_a_batch_share_keys(pg_url: str) -> None:
    o = org()
    one = tasks.submit_run(NOOP, input={"v": 1}, org_id=o, idempotency_key="a")
    batch = tasks.submit_runs([
        {"play": NOOP, "input": {"v": 1}, "org_id": o, "idempotency_key": "a"},  # earlier
        {"play": NOOP, "input": {"v": 3}, "org_id": o, "idempotency_key": "b"},
        {"play": NOOP, "input": {"v": 3.0}, "org_id": o, "idempotency_key": "b"},  # this batch
        {"play": NOOP, "input": {"v": 5}, "org_id": o},
        {"play": NOOP, "input": {"v": 6}, "org_id": o},  # no key: a run of its own
    ])
    assert [h.created for h in batch] == [False, True, False, True, True]
    assert batch[0].id == one.id and batch[1].id == batch[2].id
    assert len({h.id for h in batch}) == 4
    again = tasks.submit_runs([{"play": NOOP, "input": {"v": 3}, "org_id": o,
                                "idempotency_key": "b"}])
    assert again[0].id == batch[1].id and not again[0].created
    assert tasks.submit_run(NOOP, input={"v": 3}, org_id=o, idempotency_key="b").id \
        == batch[1].id
    stored = runs_of(o)
    assert sorted(value["v"] for _, _, value in stored) == [1, 3, 5, 6]
    assert rows_of(o) == (4, 4, 4)


def test_a_key_reused_with_another_input_or_play_is_a_conflict(pg_url: str) -> None:
    o = org()
    first = tasks.submit_run(NOOP, input={"v": 1}, org_id=o, idempotency_key="k")
    for play, value in ((NOOP, {"v": 2}), (NOOP, {"v": True}), (NOOP, None), (HELLO, {"v": 1})):
        with pytest.raises(tasks.IdempotencyConflictError) as caught:
            tasks.submit_run(play, input=value, org_id=o, idempotency_key="k")
        assert caught.value.code == "IDEMPOTENCY_CONFLICT" and caught.value.run_id == first.id
    # In a batch the conflict refuses every item: none of them is written.
    with pytest.raises(tasks.IdempotencyConflictError) as caught:
        tasks.submit_runs([{"play": NOOP, "org_id": o, "idempotency_key": "new"},
                           {"play": NOOP, "input": {"v": 2}, "org_id": o,
                            "idempotency_key": "k"}])
    assert caught.value.item == 1 and caught.value.run_id == first.id
    err = _refusal(lambda: tasks.submit_runs([
        {"play": NOOP, "input": 1, "org_id": o, "idempotency_key": "twice"},
        {"play": NOOP, "input": 2, "org_id": o, "idempotency_key": "twice"}]))
    assert err.code == "INPUT_INVALID"
    assert rows_of(o) == (1, 1, 1)
    assert tasks.run_again(first.id, idempotency_key="k").id == first.id  # the same request
    other = tasks.submit_run(NOOP, input={"v": 2}, org_id=o)
    with pytest.raises(tasks.IdempotencyConflictError) as caught:
        tasks.run_again(other.id, idempotency_key="k")
    assert caught.value.run_id == first.id
    assert tasks.submit_run(NOOP, input={"v": 1}, org_id=o, idempotency_key="k").id == first.id


def test_the_same_key_in_two_orgs_is_two_runs(pg_url: str) -> None:
    a, b = org(), org()
    hs = tasks.submit_runs([{"play": NOOP, "org_id": a, "idempotency_key": "k"},
                            {"play": NOOP, "org_id": b, "idempotency_key": "k"}])
    assert hs[0].id != hs[1].id and all(h.created for h in hs)


ITEM_FIELDS = {"play", "org_id", "input", "idempotency_key"}
BAD_ITEMS: dict[str, tuple[Any, str]] = {
    "not a dict": ("plays/x.py", "INPUT_INVALID"),
    "unknown field": ({"play": NOOP, "org_id": "o", "priority": 1}, "INPUT_INVALID"),
    "no org": ({"play": NOOP}, "INPUT_INVALID"),
    "no play": ({"org_id": "o"}, "INPUT_INVALID"),
    "blank org": ({"play": NOOP, "org_id": " "}, "INPUT_INVALID"),
    "nan input": ({"play": NOOP, "org_id": "o", "input": math.nan}, "INPUT_INVALID"),
    "long key": ({"play": NOOP, "org_id": "o", "idempotency_key": "k" * 257}, "INPUT_INVALID"),
    "missing play": ({"play": ROOT / "nope.py", "org_id": "o"}, "PLAY_NOT_FOUND"),
}


def _refusal(call: Callable[[], object]) -> PlayrunError:
    with pytest.raises(PlayrunError) as err:
        call()
    return err.value


@pytest.mark.parametrize("name", sorted(BAD_ITEMS))
def test_one_bad_item_refuses_the_whole_batch(pg_url: str, name: str) -> None:
    bad, code = BAD_ITEMS[name]
    o = org()
    if isinstance(bad, dict) and bad.get("org_id") == "o":
        bad = {**bad, "org_id": o}
    good = {"play": NOOP, "org_id": o, "idempotency_key": "good"}
    err = _refusal(lambda: tasks.submit_runs([good, good | {"idempotency_key": "g2"}, bad]))
    assert err.code == code and err.item == 2
    assert "submit_runs item 2" in str(err)
    assert rows_of(o) == (0, 0, 0)  # the good items before it were not written either
    if isinstance(bad, dict) and {"play", "org_id"} <= set(bad) <= ITEM_FIELDS:
        # The same values refused by submit_run carry the same code.
        single = _refusal(lambda: tasks.submit_run(bad["play"], bad.get("input"),
                                                   org_id=bad["org_id"],
                                                   idempotency_key=bad.get("idempotency_key")))
        assert single.code == code and single.item is None


@pytest.mark.parametrize("items", ["plays/x.py", {"play": NOOP}, 7, None])
def test_submit_runs_takes_a_list(pg_url: str, items: Any) -> None:
    assert _refusal(lambda: tasks.submit_runs(items)).code == "INPUT_INVALID"


def test_an_empty_batch_writes_nothing(pg_url: str) -> None:
    assert tasks.submit_runs([]) == []


# --- the broker messages ---------------------------------------------------------------


def test_the_direct_envelope_is_what_kombu_writes(redis_url: str) -> None:
    queue = f"playrun.test-envelope-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    message = (str(uuid.uuid4()), TASK_START_ATTEMPT, [uuid.uuid4().hex])
    try:
        lean.push(client, app, [message], queue)
        lean.produce(app, [message], queue)
        ours, theirs = (json.loads(bytes(client.rpop(queue) or b"{}"))  # type: ignore[arg-type]
                        for _ in range(2))
    finally:
        client.delete(queue)
        client.close()
    for m in (ours, theirs):
        assert m["properties"].pop("delivery_tag")
    assert ours == theirs
    assert ours["headers"]["id"] == message[0] and ours["headers"]["task"] == TASK_START_ATTEMPT


# --- SQLite: the same batch, and a relay that never publishes under the write lock -------


def test_submit_runs_on_sqlite(sqlite_db: str, published: StubPublisher, fifo: None) -> None:
    """In FIFO order: published at admission, in one pipeline."""
    o = org()
    hs = tasks.submit_runs([{"play": NOOP, "input": {"i": i % 3}, "org_id": o,
                             "idempotency_key": f"k{i % 3}"} for i in range(6)])
    assert [h.created for h in hs] == [True, True, True, False, False, False]
    assert [h.id for h in hs[3:]] == [h.id for h in hs[:3]]
    assert tasks.submit_runs([{"play": NOOP, "input": {"i": 1}, "org_id": o,
                               "idempotency_key": "k1"}])[0].id == hs[1].id
    with pytest.raises(tasks.IdempotencyConflictError) as caught:
        tasks.submit_runs([{"play": NOOP, "input": {"i": 2}, "org_id": o,
                            "idempotency_key": "k1"}])
    assert caught.value.run_id == hs[1].id
    assert rows_of(o) == (3, 3, 3)
    assert sorted(m.args[0] for m in published.sent) == sorted(h.id for h in hs[:3])
    assert [e.kind for e in tasks.run_events(hs[0].id)] == ["run.admitted"]
    err = _refusal(lambda: tasks.submit_runs([{"play": NOOP, "org_id": o, "idempotency_key":
                                               "new"}, {"play": NOOP, "org_id": ""}]))
    assert err.code == "INPUT_INVALID" and err.item == 1 and rows_of(o) == (3, 3, 3)


def _lock_is_free(db_path: str) -> bool:
    """Another connection can take SQLite's write lock right now."""
    conn = sqlite3.connect(db_path, timeout=0.05, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


class LockWatcher(StubPublisher):
    """Records, for each run started, whether SQLite's write lock was free at the send."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.seen: list[tuple[str, bool]] = []

    def send_many(self, messages: Sequence[Message], queue: str = QUEUE) -> None:
        self.seen.extend((m[2][0], _lock_is_free(self.path)) for m in messages)
        super().send_many(messages, queue)


@pytest.fixture
def lock_watcher(sqlite_db: str, fifo: None) -> Iterator[LockWatcher]:
    """The FIFO relay's publishes, each checked for SQLite's write lock."""
    path = sa.engine.make_url(sqlite_db).database
    assert path is not None
    watcher = LockWatcher(path)
    previous = use(watcher)
    yield watcher
    use(previous)


def test_a_failed_publish_leaves_rows_to_the_sweep_which_publishes_unlocked(
        lock_watcher: LockWatcher) -> None:
    lock_watcher.fail = redis.ConnectionError("broker down")
    handle = tasks.submit_run(NOOP, org_id=org())
    with session_scope(readonly=True) as s:
        row = s.execute(sa.select(Outbox.sent_at, Outbox.publish_count)
                        .where(Outbox.run_id == handle.id)).one()
    assert row == (None, 0)  # given back to the sweep

    lock_watcher.fail = None
    lock_watcher.seen.clear()
    assert relay.publish_due() == 1
    assert lock_watcher.seen == [(handle.id, True)]  # published with the write lock free
    assert relay.publish_due() == 0  # marked sent: not published twice
    with session_scope(readonly=True) as s:
        assert s.scalar(sa.select(Outbox.publish_count).where(Outbox.run_id == handle.id)) == 1


def test_resend_of_a_long_queued_run_publishes_unlocked(lock_watcher: LockWatcher) -> None:
    handle = tasks.submit_run(NOOP, org_id=org())  # "published", but no worker took it
    assert relay.resend_stale(after_s=0) == 1
    assert lock_watcher.seen == [(handle.id, True), (handle.id, True)]


# --- run_events pages ------------------------------------------------------------------


def _with_events(n: int) -> str:
    """A run (settled at once, so no worker adds to its ledger) with n more events."""
    run_id = admit(NOOP, {}, org(), None).run_id
    with session_scope() as s:
        s.execute(sa.update(Run).where(Run.id == run_id).values(status="succeeded"))
        if n:
            s.execute(sa.insert(RunEvent), [{"run_id": run_id, "kind": "run.progress",
                                             "data": {"i": i}} for i in range(n)])
    return run_id


def test_run_events_pages_through_a_long_ledger(pg_url: str) -> None:
    run_id = _with_events(10_050)
    first = tasks.run_events(run_id)  # the old call: bounded
    assert len(first) == 10_000 and first[0].kind == "run.admitted"
    assert [e.data["i"] for e in first[1:4]] == [0, 1, 2]
    rest = tasks.run_events(run_id, after=first[-1].seq)
    assert [e.data["i"] for e in rest] == list(range(9_999, 10_050))
    pages, after = [], None
    while True:
        page = tasks.run_events(run_id, after=after, limit=777)
        pages.extend(page)
        if len(page) < 777:
            break
        after = page[-1].seq
    assert [e.seq for e in pages] == sorted({e.seq for e in pages}) and len(pages) == 10_051


@pytest.mark.parametrize("kwargs", [{"after": -1}, {"after": "3"}, {"limit": 0},
                                    {"limit": 10_001}, {"limit": True}, {"after": 2**64}])
def test_run_events_refuses_bad_pages(pg_url: str, kwargs: dict[str, Any]) -> None:
    run_id = _with_events(0)
    assert _refusal(lambda: tasks.run_events(run_id, **kwargs)).code == "INPUT_INVALID"
