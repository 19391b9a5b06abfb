"""`playrun demo`: the embedded stack, the sample play end to end, progress on the terminal."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from tasks.cli import banner
from tasks.cli.output import console as plain_console
from tasks.cli.output import event_line, live_status
from tasks.cli.tracebacks import error_lines
from tasks.constants import EventKind, RunStatus
from tasks.testing import Stack

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plays" / "hello.py"


# How long the demo waits, after the terminal, for the release to be recorded.
RELEASE_WAIT_S = 15.0


def run_demo(
    play: Path = SAMPLE, name: str = "Ada", timeout: float = 120.0, keep: bool = False
) -> int:
    console = plain_console()
    stack = Stack(keep=keep)
    try:
        with live_status(console, "starting the embedded Redis, SQLite, gateway and worker"):
            stack.start()
        label = ""
        for row_label, value in banner.rows(stack):  # unindented: indented lines are the ledger's
            label = row_label or label
            console.print(f"{label:<10}{value}", markup=False)
        handle = stack.submit(
            play, {"name": name}, org_id="demo", idempotency_key=f"demo-{time.time_ns()}"
        )
        console.print(f"[bold]run[/bold] {handle.id} submitted ({play.name})")
        view = _follow(console, handle.id, timeout)
        style = "green" if view.status == RunStatus.SUCCEEDED else "red"
        console.print(f"[bold {style}]{view.status}[/bold {style}]")
        if view.output is not None:
            console.print(f"output {json.dumps(view.output)}", markup=False)
        if view.code:
            first, *more = error_lines(str(view.error or ""), view.play_path) or [""]
            console.print(f"error {view.code}: {first}", markup=False)
            for line in more:
                console.print(f"  {line}", markup=False)
        return 0 if view.status == RunStatus.SUCCEEDED else 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; stopping what the demo started[/yellow]")
        return 130
    finally:
        stack.close()
        if keep:
            console.print(f"logs and database kept in {stack.home}")


def _follow(console: Console, run_id: str, timeout: float) -> Any:
    """Print the ledger as it grows, under a live status line (on a terminal), until the
    release that follows the terminal is recorded."""
    import tasks

    seen = 0
    started = time.monotonic()
    deadline = started + timeout
    released_by: float | None = None
    with live_status(console, f"run {run_id}: submitted") as status:
        while time.monotonic() < deadline:
            events = tasks.run_events(run_id)
            for event in events[seen:]:
                console.print(event_line(event))
            seen = len(events)
            view = tasks.get_run(run_id)
            status.update(
                f"run {run_id}: {view.status}, {events[-1].kind if events else ''} "
                f"({time.monotonic() - started:.1f} s)"
            )
            if view.finished_at is not None:
                if any(e.kind == EventKind.CAPACITY_RELEASED for e in events):
                    break
                released_by = released_by or time.monotonic() + RELEASE_WAIT_S
                if time.monotonic() > released_by:
                    break
            time.sleep(0.1)
    for event in tasks.run_events(run_id)[seen:]:
        console.print(event_line(event))
    return tasks.get_run(run_id)
