"""The settings tables of docs/operations.md, generated from the pydantic settings classes.

`python -m tasks.settings_doc` prints the tables; `--write` replaces them in
docs/operations.md between the `settings-table` markers. tests/unit/test_settings_doc.py
fails when the file is out of date.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import Field
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from tasks.settings import Settings

DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
BEGIN = "<!-- settings-table: begin (python -m tasks.settings_doc --write) -->"
END = "<!-- settings-table: end -->"
AGENTCORE = Path(__file__).resolve().parent / "sandbox" / "providers" / "agentcore" / "client.py"
_CONSTRAINTS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="),
                ("min_length", "length >="), ("max_length", "length <="), ("pattern", "matches"))


def agentcore_settings() -> type[BaseSettings]:
    """AgentCoreSettings without importing its module, which needs the boto3 extra."""
    tree = ast.parse(AGENTCORE.read_text())
    node = next(n for n in tree.body
                if isinstance(n, ast.ClassDef) and n.name == "AgentCoreSettings")
    namespace: dict[str, Any] = {"BaseSettings": BaseSettings, "Field": Field,
                                 "SettingsConfigDict": SettingsConfigDict}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(AGENTCORE), "exec"),
         namespace)
    cls: type[BaseSettings] = namespace["AgentCoreSettings"]
    return cls


def _default(field: FieldInfo) -> str:
    if field.default is None:
        return "unset"
    text = str(field.default)
    if isinstance(field.default, bool):
        text = text.lower()
    if text == "":
        return "empty"
    # Paths under the home directory render as ~ so the table is the same on every machine.
    return "`" + text.replace(str(Path.home()), "~") + "`"


def _type(field: FieldInfo) -> str:
    annotation = field.annotation
    if get_origin(annotation) is Literal:
        return " or ".join(f"`{value}`" for value in get_args(annotation))
    names = [getattr(arg, "__name__", str(arg)) for arg in get_args(annotation)]
    if names:
        return " or ".join("None" if name == "NoneType" else name for name in names)
    return getattr(annotation, "__name__", str(annotation))


def _constraints(field: FieldInfo) -> str:
    found = []
    for item in field.metadata:
        for attr, sign in _CONSTRAINTS:
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{sign} `{value}`" if attr == "pattern" else f"{sign} {value}")
    return ", ".join(found)


def table(cls: type[BaseSettings]) -> str:
    """One Markdown table: a row per field of a settings class."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    rows = ["| variable | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for name, field in cls.model_fields.items():
        meaning = (field.description or "").replace("|", "\\|")
        kind = _type(field)
        rows.append(f"| `{prefix}{name.upper()}` | {kind} | {_default(field)} | "
                    f"{_constraints(field).replace('|', chr(92) + '|')} | {meaning} |")
    return "\n".join(rows)


def render() -> str:
    """The block docs/operations.md holds between its markers."""
    return "\n".join([
        BEGIN, "", "#### Core (`tasks/settings.py`)", "", table(Settings), "",
        "#### AgentCore provider (`tasks/sandbox/providers/agentcore/client.py`)", "",
        table(agentcore_settings()), "", END])


def current(text: str) -> str:
    """The generated block as it stands in a document."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def write(path: Path = DOC) -> None:
    text = path.read_text()
    path.write_text(text.replace(current(text), render()))


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        write()
    else:
        print(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
