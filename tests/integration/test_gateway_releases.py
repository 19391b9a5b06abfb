"""Releases after pushed terminals go out in batches (tasks/gateway/releases.py) and a
worker's release_attempts task releases each well-formed holder once, skipping the rest."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tasks.constants import RELEASE_BATCH_MAX, TASK_RELEASE_ATTEMPTS
from tasks.errors import InputInvalidError
from tasks.gateway.actions.base import Context
from tasks.gateway.actions.complete import settle
from tasks.gateway.beats import BeatBatcher
from tasks.gateway.refusals import Refusals
from tasks.gateway.releases import ReleaseBatcher
from tasks.release.attempt import holder_of, release_attempts
from tasks.security import tokens
from tasks.settings import get_settings
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle_launch
from tests.support.helpers import eventually
from tests.support.runs import ORG_PREFIX, close_open_runs, event_kinds, launched


class Recorder:
    """A send that records each task and, while `held`, blocks the batcher's thread."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any], str]] = []
        self.entered = threading.Event()
        self.held = threading.Event()
        self.held.set()
        self.fail = False

    def __call__(self, name: str, args: list[Any], queue: str) -> None:
        self.entered.set()
        assert self.held.wait(10)
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append((name, args, queue))


@pytest.fixture
def rec() -> Iterator[Recorder]:
    yield Recorder()


def holder(i: int) -> tuple[str, int, str]:
    return (f"{i:032x}", 1, f"token-{i}")


def test_a_quiet_gateway_sends_a_release_at_once_in_a_batch_of_one(rec: Recorder) -> None:
    batcher = ReleaseBatcher(rec, window_s=60.0)  # a window this long would show as a wait
    batcher.add(holder(1), "playrun.release")
    eventually(lambda: rec.sent, timeout=5, what="the release to be sent")
    assert rec.sent == [(TASK_RELEASE_ATTEMPTS, [[list(holder(1))]], "playrun.release")]
    batcher.close()


def test_releases_that_arrive_together_share_a_task_per_queue_in_order(rec: Recorder) -> None:
    batcher = ReleaseBatcher(rec, window_s=0.05)
    rec.held.clear()
    batcher.add(holder(0), "q1")
    assert rec.entered.wait(5)  # the first one is being sent: the rest queue up behind it
    for i, q in ((1, "q1"), (2, "q2"), (3, "q1"), (4, "q2"), (5, "q1")):
        batcher.add(holder(i), q)
    rec.held.set()
    eventually(lambda: len(rec.sent) == 3, timeout=5, what="two more sends")
    assert rec.sent[1:] == [
        (TASK_RELEASE_ATTEMPTS, [[list(holder(i)) for i in (1, 3, 5)]], "q1"),
        (TASK_RELEASE_ATTEMPTS, [[list(holder(i)) for i in (2, 4)]], "q2"),
    ]
    batcher.close()


def test_a_batch_holds_at_most_the_limit(rec: Recorder) -> None:
    batcher = ReleaseBatcher(rec, window_s=0.05)
    rec.held.clear()
    batcher.add(holder(0), "q")
    assert rec.entered.wait(5)
    for i in range(1, RELEASE_BATCH_MAX + 11):
        batcher.add(holder(i), "q")
    rec.held.set()
    batcher.close()
    sizes = [len(args[0]) for _, args, _ in rec.sent]
    assert sizes == [1, RELEASE_BATCH_MAX, 10]
    assert [h[0] for _, args, _ in rec.sent for h in args[0]] == [
        holder(i)[0] for i in range(RELEASE_BATCH_MAX + 11)]


def test_close_sends_what_is_queued(rec: Recorder) -> None:
    batcher = ReleaseBatcher(rec, window_s=60.0)
    rec.held.clear()
    batcher.add(holder(0), "q")
    assert rec.entered.wait(5)
    batcher.add(holder(1), "q")
    batcher.add(holder(2), "q")
    rec.held.set()
    batcher.close()
    assert [len(args[0]) for _, args, _ in rec.sent] == [1, 2]


def test_a_failed_send_is_logged_and_later_ones_still_go(
        rec: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    batcher = ReleaseBatcher(rec, window_s=0.01)
    rec.fail = True
    with caplog.at_level(logging.WARNING, "playrun.gateway.releases"):
        batcher.add(holder(1), "q")
        eventually(lambda: "reaper will release" in caplog.text, timeout=5,
                   what="the failure to be logged")
    rec.fail = False
    batcher.add(holder(2), "q")
    eventually(lambda: rec.sent, timeout=5, what="the next release")
    assert rec.sent == [(TASK_RELEASE_ATTEMPTS, [[list(holder(2))]], "q")]
    batcher.close()


@pytest.mark.parametrize("bad", [
    None, "x", [1, 2], [uuid.uuid4().hex, 0, "t"], [uuid.uuid4().hex, True, "t"],
    [uuid.uuid4().hex, 1, 7], [uuid.uuid4().hex, 1, "t" * 65], ["not-a-run-id", 1, "t"],
    [uuid.uuid4().hex, 2**40, "t"],
    # The sandbox the terminal's write read: [resource id, provider, sandbox id], bounded.
    [uuid.uuid4().hex, 1, "t", "fsb-1"], [uuid.uuid4().hex, 1, "t", ["r", "fake"]],
    [uuid.uuid4().hex, 1, "t", ["r", "fake", ""]], [uuid.uuid4().hex, 1, "t", ["r", 7, "s"]],
    [uuid.uuid4().hex, 1, "t", ["r", "p" * 65, "s"]], [uuid.uuid4().hex, 1, "t", None, None],
])
def test_a_malformed_holder_is_refused_with_a_code(bad: Any) -> None:
    with pytest.raises(InputInvalidError) as caught:
        holder_of(bad)
    assert caught.value.code == "INPUT_INVALID"


@pytest.fixture
def _no_open_runs_left(pg_url: str) -> Iterator[None]:
    yield
    close_open_runs(ORG_PREFIX)


def test_release_attempts_releases_each_holder_and_skips_the_malformed(
        _no_open_runs_left: None, caplog: pytest.LogCaptureFixture) -> None:
    runs = [launched() for _ in range(3)]
    for fence, _ in runs:
        assert settle_launch(fence, Outcome("succeeded", output={})).won
    holders: list[Any] = [[f.run_id, f.generation, token] for f, token in runs]
    holders.insert(1, ["../etc", 1, "t"])
    holders.append([runs[0][0].run_id, 1, "not-the-holder"])  # well-formed: releases nothing
    with caplog.at_level(logging.ERROR, "playrun.release"):
        assert release_attempts(holders) == 4
    assert "holder 1 skipped: INPUT_INVALID" in caplog.text
    for fence, _ in runs:
        assert event_kinds(fence.run_id)[-3:] == ["run.succeeded", "sandbox.deleted",
                                                  "capacity.released"]
    assert release_attempts("not a list") == 0


def test_a_pushed_terminal_hands_its_sandbox_to_the_release(
        _no_open_runs_left: None, rec: Recorder) -> None:
    """The terminal's write reads the holder's one sandbox; the release message carries it
    and the worker deletes that sandbox, marks it and frees the slot without reading."""
    fence, token = launched()
    batcher = ReleaseBatcher(rec, window_s=0.0)
    ctx = Context(get_settings(), BeatBatcher(30.0, 0.0), batcher, Refusals(3000, 60.0))
    grant = tokens.Grant("org", fence.run_id, fence.generation, fence.launch_id,
                         frozenset(tokens.RUNNER_CAPABILITIES), time.time() + 60)
    assert settle(grant, Outcome("succeeded", output={}), ctx).won
    eventually(lambda: rec.sent, timeout=5, what="the release to be sent")
    batcher.close()
    [(name, [[sent]], _queue)] = rec.sent
    assert name == TASK_RELEASE_ATTEMPTS and sent[:3] == [fence.run_id, fence.generation, token]
    resource_id, provider_name, sandbox_id = sent[3]
    assert provider_name == "fake" and sandbox_id.startswith("fsb-") and len(resource_id) == 32
    assert release_attempts([sent]) == 1
    assert event_kinds(fence.run_id)[-3:] == ["run.succeeded", "sandbox.deleted",
                                              "capacity.released"]
    assert release_attempts([sent]) == 1  # a repeat: nothing more is written
    assert event_kinds(fence.run_id)[-3:] == ["run.succeeded", "sandbox.deleted",
                                              "capacity.released"]
