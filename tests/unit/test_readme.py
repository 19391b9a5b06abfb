"""The README's code blocks marked as runnable run as written.

Markers, on the line before a fenced block:
- `<!-- runnable -->` before a ```python block: the block is executed, from the repository
  root, on a real stack (tasks.testing's `playrun_stack`: SQLite, a private valkey-server,
  gateway, worker and beat), with `tasks` pointed at it as app code would be.
- `<!-- excerpt: PATH -->` before a ```python block: every code line of the block (its
  comments and `...` left out) is a line of PATH, so an abridged listing cannot drift from
  the file it shows.
Blocks without a marker (shell commands that need a long-running stack, say) are not run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks.testing import Stack

pytest_plugins = ["tasks.testing.pytest_plugin"]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCK = re.compile(r"^<!-- (runnable|excerpt: (\S+)) -->\n```(\w+)\n(.*?)^```$", re.M | re.S)


def _blocks(kind: str) -> list[tuple[str, str]]:
    found = []
    for match in BLOCK.finditer(README.read_text()):
        marker, path, language, code = match.groups()
        assert language == "python", f"only python blocks can be marked, not {language}"
        if marker.split(":")[0] == kind:
            found.append((path or "", code))
    return found


def _code_lines(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        code = re.sub(r"\s+#.*$", "", line).strip()
        if code and not code.startswith("#") and code != "...":
            lines.append(code)
    return lines


def test_the_readme_marks_blocks_to_run() -> None:
    assert _blocks("runnable") and _blocks("excerpt")


@pytest.mark.parametrize("path,code", _blocks("excerpt"))
def test_excerpts_match_their_files(path: str, code: str) -> None:
    source = set(_code_lines((ROOT / path).read_text()))
    missing = [line for line in _code_lines(code) if line not in source]
    assert not missing, f"README lines not in {path}: {missing}"


@pytest.mark.parametrize("code", [code for _, code in _blocks("runnable")])
def test_runnable_blocks_run(code: str, playrun_stack: Stack,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {"__name__": "readme"}
    exec(compile(code, str(README), "exec"), namespace)  # the README's own app code
