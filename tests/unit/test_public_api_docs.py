"""Every public name of `tasks` has a docstring of its own: the API reference
(docs/api.md, built by mkdocstrings) shows nothing else."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import tasks

PUBLIC = [name for name in tasks.__all__ if name != "app"]  # app: Celery's own


@pytest.mark.parametrize("name", PUBLIC)
def test_public_names_have_docstrings(name: str) -> None:
    doc = inspect.getdoc(getattr(tasks, name)) or ""
    # A dataclass without a docstring gets its signature as one: that does not count.
    assert doc and not doc.startswith(f"{name}("), f"tasks.{name} has no docstring"


def test_the_api_reference_lists_every_public_name() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    missing = [name for name in PUBLIC if f"        - {name}\n" not in page]
    assert not missing, f"docs/api.md does not list {missing}"
