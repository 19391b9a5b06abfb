"""A play whose sandbox disk is full while it runs: ctx.log and print must not raise into
the play (found by the chaos suite: 9 of 60 runs failed PLAY_ERROR "No space left on
device" from ctx.log). The gateway still gets each event; only the file's copy is lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks.execution.runner import BoundedWriter, Context
from tests.support.tmpfs import fill, small_tmpfs


@pytest.fixture
def full_dir(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, "1m") as root:
        yield root


class Uplink:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def add(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def test_ctx_log_and_print_on_a_full_disk_do_not_fail_the_play(full_dir: Path) -> None:
    uplink = Uplink()
    ctx = Context(full_dir, uplink)
    out = BoundedWriter(full_dir / "stdout.txt")
    fill(full_dir)
    for i in range(200):  # more than any buffer: the writes really reach the full disk
        ctx.log("ran", i=i, pad="x" * 100)
        out.write("y" * 200 + "\n")
        out.flush()
    assert [e["fields"]["i"] for e in uplink.events] == list(range(200))
    assert out.dropped > 0
    (full_dir / "filler").unlink()
    ctx.log("after", i=200)  # space again: logging carries on
    assert uplink.events[-1]["message"] == "after"
    out.finish()
    ctx.close()
