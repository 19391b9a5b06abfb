"""A small real tmpfs for tests of a full disk (skips where mounting is not allowed)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(parent: Path, size: str) -> Iterator[Path]:
    root = parent / "tmpfs"
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def fill(root: Path, chunk: int = 4096) -> Path:
    """Write a file under root until the filesystem refuses (ENOSPC); returns its path."""
    filler = root / "filler"
    with pytest.raises(OSError), open(filler, "wb") as f:
        while True:
            f.write(b"\0" * chunk)
            f.flush()
    return filler
