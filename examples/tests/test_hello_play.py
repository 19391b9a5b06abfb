"""Testing a play end to end, as a user's project would: a real stack (SQLite, a private
valkey-server, the gateway, a worker and beat) started once for the session by the
`playrun_stack` fixture; each test submits the play and waits through the public API.

In your own project, put the `pytest_plugins` line in your tests' conftest.py."""

from pathlib import Path

from tasks.testing import Stack

pytest_plugins = ["tasks.testing.pytest_plugin"]

HELLO = Path(__file__).resolve().parents[1] / "plays" / "hello.py"


def test_hello_greets_by_name(playrun_stack: Stack) -> None:
    view = playrun_stack.run(HELLO, {"name": "Ada"})
    assert view.status == "succeeded", view.error
    assert view.output == {"greeting": "Hello, Ada!", "shout": "ADA"}


def test_hello_logs_each_letter(playrun_stack: Stack) -> None:
    handle = playrun_stack.submit(HELLO, {"name": "Bo"})
    assert playrun_stack.wait(handle).status == "succeeded"
    progress = [e.data for e in playrun_stack.events(handle) if e.kind == "run.progress"]
    letters = [d["fields"]["letter"] for d in progress if d.get("message") == "letter"]
    assert letters == ["B", "o"]
