"""The local provider with its root on a full filesystem: creating a sandbox is refused as
capacity unavailable (deferred, as a start that ran nothing), not as a broken start (found
by the chaos suite: a full sandbox disk failed every run started meanwhile with
SANDBOX_START_FAILED), and works again once space is freed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tasks.sandbox import LocalProvider, SandboxSpec
from tasks.sandbox.base import CapacityUnavailableError
from tests.support.tmpfs import fill, small_tmpfs


@pytest.fixture
def full_root(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, "2m") as root:
        yield root


def test_a_full_disk_is_capacity_unavailable_and_a_freed_one_works(full_root: Path) -> None:
    provider = LocalProvider(full_root / "sandboxes", isolation="process")
    filler = fill(full_root, chunk=65536)  # up to ENOSPC
    spec = SandboxSpec(labels={"playrun": "1"}, files={"play.py": b"x" * 8192})
    with pytest.raises(CapacityUnavailableError) as refused:
        provider.create(spec)
    assert refused.value.kind == "capacity_unavailable"
    assert provider.list({"playrun": "1"}) == []  # nothing half-made is left behind
    filler.unlink()
    ref = provider.create(spec)
    assert [r.sandbox_id for r in provider.list({"playrun": "1"})] == [ref.sandbox_id]
    provider.delete(ref.sandbox_id)


def test_a_disk_that_fills_after_create_refuses_the_exec_as_capacity(full_root: Path) -> None:
    """Found by the chaos suite (11 of 60 runs SANDBOX_START_FAILED): the sandbox was made,
    then the disk filled before exec could write the process record. Nothing ran: capacity
    unavailable, and the supervisor started for it is gone, not left waiting on stdin."""
    provider = LocalProvider(full_root / "sandboxes", isolation="process")
    ref = provider.create(SandboxSpec(labels={"playrun": "1"}, files={"play.py": b"x = 1\n"}))
    filler = fill(full_root, chunk=65536)
    with pytest.raises(CapacityUnavailableError) as refused:
        provider.exec_detached(ref.sandbox_id, ["{python}", "-c", "open('ran', 'w')"],
                               env={}, timeout_s=30)
    assert refused.value.kind == "capacity_unavailable" and "No space" in str(refused.value)
    assert provider.poll(ref.sandbox_id).state == "never_started"
    control = str(full_root / "sandboxes" / ".control" / ref.sandbox_id)
    left = subprocess.run(["pgrep", "-f", control], capture_output=True, text=True,
                          check=False)
    assert left.stdout == "", "a supervisor was left waiting for its config"
    filler.unlink()
    provider.delete(ref.sandbox_id)
    assert provider.list({"playrun": "1"}) == []


def test_a_launch_refused_for_space_is_no_room_not_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """launch() maps the provider's capacity refusal to NO_ROOM (jobs defers it)."""
    from tasks.execution import launch as launch_mod

    class Full:
        name = "local"

        def exec_detached(self, *_a: object, **_k: object) -> None:
            raise CapacityUnavailableError("no space to start sandbox s: [Errno 28]")

    monkeypatch.setattr(launch_mod, "record_launch",
                        lambda *_a, **_k: launch_mod.LaunchMark("l1", 0.0))
    monkeypatch.setattr(launch_mod, "runner_env", lambda *_a, **_k: {})
    ref = SimpleNamespace(sandbox_id="s")
    out = launch_mod.launch(None, Full(), ref, None, "org", SimpleNamespace(  # type: ignore[arg-type]
        run_timeout_s=30.0, exit_report=False))
    assert (out.step, out.launch_id) == (launch_mod.Launch.NO_ROOM, "l1")
