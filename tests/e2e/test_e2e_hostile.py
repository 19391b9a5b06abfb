"""Plays and sandboxes that misbehave still end with a clear outcome, never a stuck run."""

from __future__ import annotations

import uuid

import pytest

import tasks
from tasks.sandbox.runtime import provider
from tests.support.helpers import eventually, kinds
from tests.support.paths import PLAYS
from tests.support.stack import Worker

pytestmark = pytest.mark.slow


def org() -> str:
    return f"org-{uuid.uuid4().hex[:8]}"


def test_nul_characters_and_lone_surrogates_are_stored_not_fatal(worker: Worker) -> None:
    handle = tasks.submit_run(PLAYS / "nul_bytes.py", input={}, org_id=org())
    result = handle.wait(timeout=60)
    assert result.status == "succeeded"
    assert result.output == {"text": "a\ufffdb", "key\ufffd": ["?"]}
    progress = [e.data for e in tasks.run_events(handle.id) if e.kind == "run.progress"]
    assert progress == [{"message": "nul \ufffd here", "fields": {"odd": "?", "fine": 1}}]


def test_a_result_file_replaced_by_a_symlink_is_output_invalid(worker: Worker) -> None:
    result = tasks.submit_run(PLAYS / "symlink_result.py", input={}, org_id=org()).wait(
        timeout=60)
    assert (result.status, result.code) == ("failed", "OUTPUT_INVALID")
    assert "root:" not in (result.error or "")


def test_a_sandbox_deleted_under_a_running_play_is_runner_lost(worker: Worker) -> None:
    handle = tasks.submit_run(PLAYS / "forever.py", input={}, org_id=org())
    eventually(lambda: "run.progress" in kinds(handle.id), what="the play to start")
    sandbox_id = tasks.get_run(handle.id).sandbox_id
    assert sandbox_id
    provider("local").delete(sandbox_id)  # an operator, or the host, removes it
    result = handle.wait(timeout=60)
    assert (result.status, result.code) == ("failed", "RUNTIME_RUNNER_LOST")
    eventually(lambda: "capacity.released" in kinds(handle.id), what="the lease released")
