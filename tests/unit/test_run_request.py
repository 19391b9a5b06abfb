"""The typed public API on the embedded SQLite database: RunRequest items, enum statuses."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

import tasks
from tasks import RunRequest, RunStatus
from tasks.broker.publish import StubPublisher
from tasks.errors import PlayrunError
from tests.support.paths import ROOT

NOOP = ROOT / "examples" / "plays" / "noop.py"


@pytest.fixture
def db(sqlite_db: str, published: StubPublisher, fifo: None) -> list[Any]:
    """A migrated SQLite database; start messages are recorded instead of published (at
    admission: FIFO order)."""
    return published.sent


def org() -> str:
    return f"typed-{uuid.uuid4().hex[:8]}"


def refusal(call: Callable[[], object]) -> PlayrunError:
    with pytest.raises(PlayrunError) as err:
        call()
    return err.value


def test_run_requests_are_admitted_like_dicts(db: list[Any]) -> None:
    o = org()
    hs = tasks.submit_runs(
        [
            RunRequest(NOOP, o, {"i": 0}, "k0"),
            {"play": NOOP, "input": {"i": 1}, "org_id": o, "idempotency_key": "k1"},
            RunRequest(play=str(NOOP), org_id=o, input={"i": 1}, idempotency_key="k1"),
        ]
    )
    assert [h.created for h in hs] == [True, True, False]
    assert hs[2].id == hs[1].id  # the key, whichever form carried it
    again = tasks.submit_runs([{"play": NOOP, "org_id": o, "input": {"i": 0},
                                "idempotency_key": "k0"}])
    assert again[0].id == hs[0].id and not again[0].created
    views = [tasks.get_run(h.id) for h in hs[:2]]
    assert [v.output for v in views] == [None, None]
    assert [(v.org_id, v.idempotency_key, v.play_path) for v in views] == [
        (o, "k0", str(NOOP)),
        (o, "k1", str(NOOP)),
    ]
    assert sorted(m.args[0] for m in db) == sorted(h.id for h in hs[:2])


def test_run_request_without_input_stores_none(db: list[Any]) -> None:
    o = org()
    typed = tasks.submit_runs([RunRequest(NOOP, o)])[0]
    plain = tasks.submit_runs([{"play": NOOP, "org_id": o}])[0]
    assert tasks.get_run(typed.id).status == tasks.get_run(plain.id).status == "queued"


@pytest.mark.parametrize(
    ("typed", "plain"),
    [
        (RunRequest(NOOP, ""), {"play": NOOP, "org_id": ""}),
        (RunRequest(NOOP, "o", float("nan")), {"play": NOOP, "org_id": "o", "input": float("nan")}),
        (
            RunRequest(ROOT / "no-such-play.py", "o"),
            {"play": ROOT / "no-such-play.py", "org_id": "o"},
        ),
        (
            RunRequest(NOOP, "o", idempotency_key=""),
            {"play": NOOP, "org_id": "o", "idempotency_key": ""},
        ),
        (RunRequest(42, "o"), {"play": 42, "org_id": "o"}),  # type: ignore[arg-type]
    ],
)
def test_a_bad_run_request_is_refused_as_the_dict_is(
    db: list[Any], typed: RunRequest, plain: dict[str, Any]
) -> None:
    ok = {"play": NOOP, "org_id": org()}
    a = refusal(lambda: tasks.submit_runs([ok, typed]))
    b = refusal(lambda: tasks.submit_runs([ok, plain]))
    assert (type(a), a.code, a.item, a.message) == (type(b), b.code, b.item, b.message)
    assert a.item == 1 and a.code in ("INPUT_INVALID", "PLAY_NOT_FOUND")
    assert db == []  # the batch was refused whole


def test_an_item_of_another_type_is_refused(db: list[Any]) -> None:
    err = refusal(lambda: tasks.submit_runs([("play", "org")]))  # type: ignore[list-item]
    assert err.code == "INPUT_INVALID" and err.item == 0
    assert "RunRequest or a dict" in err.message


def test_statuses_are_run_status_members(db: list[Any]) -> None:
    o = org()
    handle = tasks.submit_run(NOOP, org_id=o)
    view = tasks.get_run(handle.id)
    assert type(view.status) is RunStatus and view.status is RunStatus.QUEUED
    assert view.status == "queued"  # still equal to the plain string
    cancelled = tasks.cancel_run(handle.id)
    assert cancelled.status is RunStatus.CANCELLED
    result = handle.wait(timeout=5)
    assert type(result.status) is RunStatus and result.status == "cancelled"
    assert result == cancelled.result()
    [listed] = tasks.list_runs(org_id=o)
    assert listed.status is RunStatus.CANCELLED
    assert [e.kind for e in tasks.run_events(handle.id)] == [
        tasks.EventKind.ADMITTED,
        tasks.EventKind.CANCEL_REQUESTED,
        tasks.EventKind.CANCELLED,
    ]
