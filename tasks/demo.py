"""`playrun demo`: the embedded stack, the sample play end to end, progress on the terminal."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from rich.console import Console

from tasks.embedded import Stack

SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "plays" / "hello.py"


# How long the demo waits, after the terminal, for the release to be recorded.
RELEASE_WAIT_S = 15.0


def run_demo(play: Path = SAMPLE, name: str = "Ada", timeout: float = 120.0,
             keep: bool = False) -> int:
    console = Console()
    home = Path(tempfile.mkdtemp(prefix="playrun-demo-"))
    stack = Stack(home)
    try:
        with console.status("starting the embedded Redis, SQLite, the gateway and a worker..."):
            stack.start_redis()
            os.environ.update(stack.env)
            from tasks.settings import reset_settings

            reset_settings()
            from tasks import db

            db.upgrade()
            stack.start_gateway()
            stack.start_celery("worker", "--concurrency=2")
            stack.start_celery("beat")
        import tasks

        handle = tasks.submit_run(play, input={"name": name}, org_id="demo",
                                  idempotency_key=f"demo-{time.time_ns()}")
        console.print(f"[bold]run[/bold] {handle.id} submitted ({play.name})")
        seen = 0
        deadline = time.monotonic() + timeout
        released_by: float | None = None
        while time.monotonic() < deadline:
            events = tasks.run_events(handle.id)
            for event in events[seen:]:
                console.print(f"  [dim]{event.at:%H:%M:%S.%f}[/dim] [cyan]{event.kind}[/cyan] "
                              f"{_brief(event.data)}")
            seen = len(events)
            if tasks.get_run(handle.id).finished_at is not None:
                # The release (sandbox, capacity) follows the terminal: show it too.
                if any(e.kind == "capacity.released" for e in events):
                    break
                released_by = released_by or time.monotonic() + RELEASE_WAIT_S
                if time.monotonic() > released_by:
                    break
            time.sleep(0.1)
        view = tasks.get_run(handle.id)
        for event in tasks.run_events(handle.id)[seen:]:
            console.print(f"  [dim]{event.at:%H:%M:%S.%f}[/dim] [cyan]{event.kind}[/cyan] "
                          f"{_brief(event.data)}")
        style = "green" if view.status == "succeeded" else "red"
        console.print(f"[bold {style}]{view.status}[/bold {style}] output={view.output!r}"
                      + (f" code={view.code} error={view.error}" if view.code else ""))
        return 0 if view.status == "succeeded" else 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; stopping what the demo started[/yellow]")
        return 130
    finally:
        stack.stop()
        if not keep:
            import shutil

            shutil.rmtree(home, ignore_errors=True)
        else:
            console.print(f"logs and database kept in {home}")


def _brief(data: dict[str, object]) -> str:
    return " ".join(f"{k}={v!r}" for k, v in data.items() if v is not None)
