"""A worker killed after recording a sandbox's process but before handing its supervisor the
exec config (on stdin) ran nothing of the play. The sandbox says `never_started`, not a
lost process, so the run is tried again instead of failing RUNTIME_RUNNER_LOST ("vanished").

Found by `bench/bench_recovery.py --kill-mode group`: the process record is written (and
fsynced) between starting the supervisor and writing its config, so a group kill of the
worker lands there now and then.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.sandbox import LocalProvider, SandboxSpec, supervisor_proc
from tasks.sandbox.local import probe_strict
from tasks.sandbox.local.records import PROC_FILE
from tasks.settings import get_settings
from tests.support.helpers import eventually


@pytest.fixture(params=["strict", "process"])
def provider(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalProvider]:
    root = tmp_path / "sandboxes"
    if request.param == "strict" and (problem := probe_strict(get_settings(), root)):
        pytest.skip(f"strict isolation unavailable: {problem}")
    prov = LocalProvider(root, isolation=request.param)
    yield prov
    for ref in prov.list({}):
        prov.delete(ref.sandbox_id)


def _launch_and_die(root: str, isolation: str, sandbox_id: str) -> None:
    """In a forked child: exec, SIGKILLed right after the process record is written."""
    write_atomic = supervisor_proc.write_atomic

    def write_then_die(path: Path, data: bytes) -> None:
        write_atomic(path, data)
        if path.name == PROC_FILE:
            os.kill(os.getpid(), signal.SIGKILL)

    supervisor_proc.write_atomic = write_then_die  # type: ignore[assignment]
    LocalProvider(Path(root), isolation=isolation).exec_detached(  # type: ignore[arg-type]
        sandbox_id, ["{python}", "-c", "open('ran', 'w').write('ran')"], env={}, timeout_s=30)


def test_a_worker_killed_before_the_handover_leaves_a_never_started_sandbox(
        provider: LocalProvider) -> None:
    sandbox_id = provider.create(SandboxSpec(labels={}, files={})).sandbox_id
    child = multiprocessing.get_context("fork").Process(
        target=_launch_and_die, args=(str(provider.root), provider.isolation, sandbox_id))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert (provider.control_root / sandbox_id / PROC_FILE).exists()

    state = eventually(lambda: (s := provider.poll(sandbox_id).state) != "running" and s,
                       timeout=15, what="the supervisor to give up")
    assert state == "never_started"
    assert not (provider.root / sandbox_id / "ran").exists()
