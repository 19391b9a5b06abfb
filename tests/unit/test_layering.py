"""The shape of tasks/: no import cycle between its top-level folders, no module over
400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import ROOT

TASKS = ROOT / "tasks"
MAX_LINES = 400
# Modules allowed past MAX_LINES (generated files would go here): none today.
KNOWN_OVER: set[str] = set()


def _unit(path: Path) -> str:
    """A module's top-level part of tasks: its folder, or the root module itself."""
    first = path.relative_to(TASKS).parts[0]
    return first.removesuffix(".py")


def _imported_units(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "tasks":  # `from tasks import api`
                names += [f"tasks.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if (
                parts[0] == "tasks"
                and len(parts) > 1
                and ((TASKS / parts[1]).is_dir() or (TASKS / f"{parts[1]}.py").exists())
            ):
                found.add(parts[1])
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in TASKS.rglob("*.py"):
        unit = _unit(path)
        if unit == "__init__":  # the package's lazy public face imports from everywhere
            continue
        graph.setdefault(unit, set()).update(_imported_units(path) - {unit, "__init__"})
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_top_level_folders_of_tasks_import_without_a_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_of_tasks_is_over_400_lines() -> None:
    over = {
        str(p.relative_to(ROOT)): n
        for p in TASKS.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert set(over) - KNOWN_OVER == set(), over
