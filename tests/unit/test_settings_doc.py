"""docs/operations.md lists every setting as the settings classes define it."""

from __future__ import annotations

from tasks import settings_doc
from tasks.settings import Settings


def test_the_settings_tables_in_operations_md_are_current() -> None:
    text = settings_doc.DOC.read_text()
    assert settings_doc.current(text) == settings_doc.render(), (
        "docs/operations.md is out of date: run `python -m tasks.settings_doc --write`")


def test_every_setting_is_described_and_listed() -> None:
    block = settings_doc.render()
    for name, field in Settings.model_fields.items():
        assert field.description, f"PLAYRUN_{name.upper()} has no description"
        assert f"`PLAYRUN_{name.upper()}`" in block
    for name in settings_doc.agentcore_settings().model_fields:
        assert f"`PLAYRUN_AGENTCORE_{name.upper()}`" in block
