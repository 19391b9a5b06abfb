"""The local provider with its root on a full filesystem: creating a sandbox is refused as
capacity unavailable (deferred, as a start that ran nothing), not as a broken start (found
by the chaos suite: a full sandbox disk failed every run started meanwhile with
SANDBOX_START_FAILED), and works again once space is freed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.sandbox import LocalProvider, SandboxSpec
from tasks.sandbox.base import CapacityUnavailableError


@pytest.fixture
def full_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "tmpfs"
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(root)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def test_a_full_disk_is_capacity_unavailable_and_a_freed_one_works(full_root: Path) -> None:
    provider = LocalProvider(full_root / "sandboxes", isolation="process")
    filler = full_root / "filler"
    with pytest.raises(OSError), open(filler, "wb") as f:  # fill it up to ENOSPC
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    spec = SandboxSpec(labels={"playrun": "1"}, files={"play.py": b"x" * 8192})
    with pytest.raises(CapacityUnavailableError) as refused:
        provider.create(spec)
    assert refused.value.kind == "capacity_unavailable"
    assert provider.list({"playrun": "1"}) == []  # nothing half-made is left behind
    filler.unlink()
    ref = provider.create(spec)
    assert [r.sandbox_id for r in provider.list({"playrun": "1"})] == [ref.sandbox_id]
    provider.delete(ref.sandbox_id)
