"""A strict (bubblewrap) sandbox outlives the worker that launched it, as a process one
does, and nothing but its own delete ends it.

Found by `bench/bench_recovery.py --kill-mode group` with strict isolation: a worker killed
with its whole process group leaves its finished sandboxes to be deleted seconds later by
another worker, and by then the kernel has given their PID namespace's inode number to a
newer sandbox's namespace; deleting an old sandbox by that number SIGKILLed the new one's
play (RUNTIME_RUNNER_LOST, "exited with code -9").
"""

from __future__ import annotations

import json
import secrets
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

import tasks
from tasks.constants import LABEL_RUN
from tasks.sandbox import LocalProvider, SandboxSpec, supervisor_proc, supervisor_strict
from tasks.sandbox.local import probe_strict
from tasks.sandbox.local.processes import is_live
from tasks.sandbox.local.records import read_json
from tasks.settings import get_settings
from tests.support.env import SANDBOX_ROOT
from tests.support.helpers import eventually, kinds
from tests.support.paths import PLAYS
from tests.support.runs import FAST_RECOVERY, FAST_STARTS
from tests.support.stack import Worker, worker_env

STRICT = {"PLAYRUN_SANDBOX_ISOLATION": "strict", **FAST_RECOVERY, **FAST_STARTS}


def _strict_unavailable() -> str | None:
    return probe_strict(get_settings(), SANDBOX_ROOT)


if _strict_unavailable():
    pytest.skip(f"strict isolation unavailable here: {_strict_unavailable()}",
                allow_module_level=True)


def ns_record(provider: LocalProvider, sandbox_id: str) -> dict[str, Any]:
    return read_json(provider.control_root / sandbox_id / supervisor_proc.NS_FILE) or {}


def finished_sandbox(provider: LocalProvider) -> str:
    """A strict sandbox whose command has run and exited: its PID namespace is gone."""
    sandbox_id = provider.create(SandboxSpec(labels={}, files={})).sandbox_id
    provider.exec_detached(sandbox_id, ["{python}", "-c", "pass"], env={}, timeout_s=30)
    eventually(lambda: provider.poll(sandbox_id).state == "exited", timeout=15,
               what="the old sandbox's command to exit")
    assert ns_record(provider, sandbox_id).get("pidns")
    return sandbox_id


def reuse_namespace_number(provider: LocalProvider, old: str, pidns: int) -> None:
    """What the kernel does once `old`'s namespace is gone: it hands the inode number on
    (lowest free first) to the next namespace made. Done here on the record, so that the
    number names the live namespace every time, whatever else runs on this machine."""
    record = ns_record(provider, old)
    record["pidns"] = pidns
    path = provider.control_root / old / supervisor_proc.NS_FILE
    supervisor_proc.write_atomic(path, json.dumps(record).encode())


def outer_pids(marker: str) -> set[int]:
    return {pid for pid in supervisor_proc.process_table()
            if any(marker in a for a in supervisor_proc.read_cmdline(pid))}


def test_deleting_an_old_sandbox_spares_the_one_that_got_its_namespace_number(
        tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "sandboxes", isolation="strict")
    old = finished_sandbox(provider)
    new = provider.create(SandboxSpec(labels={}, files={})).sandbox_id
    tag = f"sleeper-{secrets.token_hex(4)}"
    provider.exec_detached(new, ["{python}", "-c", f"import time; time.sleep(60)  # {tag}"],
                           env={}, timeout_s=90)
    sleeper = eventually(lambda: outer_pids(tag), what="the new sandbox's command")
    pidns = eventually(lambda: ns_record(provider, new).get("pidns"), what="its ns record")
    reuse_namespace_number(provider, old, pidns)

    provider.delete(old)

    assert all(is_live(pid) for pid in sleeper), "an old sandbox's delete killed a new one"
    assert provider.poll(new).state == "running"
    # Its own delete still ends it, at once: nothing of it outlives the delete.
    everything = outer_pids(supervisor_strict.BWRAP_MARK + new) | sleeper
    provider.delete(new)
    assert not [pid for pid in everything if is_live(pid)]


@pytest.mark.slow
def test_a_strict_play_outlives_a_group_kill_of_its_worker(pg_url: str) -> None:
    first = Worker(worker_env(**STRICT))
    first.wait_ready()
    assert "sandbox isolation: strict" in first.output()
    handle = tasks.submit_run(PLAYS / "counter.py", input={"seconds": 6},
                              org_id=f"org-{uuid.uuid4().hex[:6]}")
    eventually(lambda: "run.progress" in kinds(handle.id), what="the play to start")
    provider = LocalProvider(SANDBOX_ROOT, isolation="strict")
    [ref] = provider.list({LABEL_RUN: handle.id})
    pidns = eventually(lambda: ns_record(provider, ref.sandbox_id).get("pidns"),
                       what="the play's ns record")
    first.stop(signal.SIGKILL)  # killpg: the main process and its pool children

    # What such a kill leaves the next worker: a finished sandbox deleted late, after its
    # namespace's number went to a live sandbox's (here, the play's).
    stale = finished_sandbox(provider)
    reuse_namespace_number(provider, stale, pidns)
    provider.delete(stale)  # as the next worker's release or GC does
    assert provider.poll(ref.sandbox_id).state == "running"

    second = Worker(worker_env(**STRICT))
    try:
        second.wait_ready()
        result = handle.wait(timeout=60)
    finally:
        second.stop()
    assert result.status == "succeeded", (result, kinds(handle.id))
    assert result.output == {"ok": True}
    assert kinds(handle.id).count("run.progress") == 1, "the play ran more than once"
    assert [a.generation for a in tasks.get_run(handle.id).attempts] == [1]
