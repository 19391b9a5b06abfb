"""A run's error as `show` prints it: the message, then the play's own frames of the
traceback the runner recorded, each on its lines and named by the submitted file."""

from __future__ import annotations

import re

# The name the runner gives the play inside every sandbox (tasks/execution/runner.py).
SANDBOX_PLAY_FILE = "play.py"
_MARKER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", (?P<rest>line \d+.*)$')


def error_lines(error: str, play_path: str) -> list[str]:
    """The message lines, then `File "<play_path>", line N, in fn` and its source line for
    each frame in the play; the runtime's own frames (runner, stdlib) are left out."""
    head, marker, tail = error.partition(_MARKER)
    lines = [line for line in head.rstrip().splitlines() if line.strip()]
    if not marker:
        return lines
    keep = False
    for line in tail.splitlines():
        frame = _FRAME.match(line)
        if frame:
            name = frame["file"].replace("\\", "/").rsplit("/", 1)[-1]
            keep = name == SANDBOX_PLAY_FILE
            if keep:
                lines.append(f'  File "{play_path}", {frame["rest"]}')
        elif keep and line.startswith("    "):
            lines.append(line.rstrip())
        else:  # a cut line where the runner bounded the text
            keep = False
    return lines
