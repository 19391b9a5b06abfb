"""The DevTools pipe reaches the browser on fds 3 and 4 whatever fds the pipes had,
including a pipe that already is fd 3 or 4 (where dup2 alone keeps close-on-exec and
chromium says "Remote debugging pipe file descriptors are not open")."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import ROOT

# Run in a fresh interpreter (pytest's own capture uses low fds): free fds 3 and 4, make
# the pipes in the order the layout needs, start a child through pipe_fds that echoes
# fd 3 onto fd 4 upper-cased, and print what came back.
PARENT = """
import os, subprocess, sys
from tests.support.cdp import pipe_fds

layout = sys.argv[1]
for fd in (3, 4):
    try:
        os.close(fd)
    except OSError:
        pass
if layout == "both-elsewhere":
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(2)]
if layout == "replies-already-4":
    from_child_r, from_child_w = os.pipe()
    to_child_r, to_child_w = os.pipe()
    assert from_child_w == 4, from_child_w
else:
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    assert (to_child_r == 3) == (layout == "commands-already-3"), to_child_r
child = subprocess.Popen(
    [sys.executable, "-c", "import os; os.write(4, os.read(3, 64).upper())"],
    close_fds=False, preexec_fn=lambda: pipe_fds(to_child_r, from_child_w))
os.close(to_child_r)
os.close(from_child_w)
os.write(to_child_w, b"ping")
os.close(to_child_w)
child.wait(timeout=30)
print(child.returncode, os.read(from_child_r, 64).decode())
"""


@pytest.mark.parametrize("layout", ["both-elsewhere", "commands-already-3", "replies-already-4"])
def test_the_child_reads_fd_3_and_writes_fd_4(layout: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PARENT, layout],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "PING"], proc.stderr
