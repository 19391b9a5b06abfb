"""How `--help` names things: a flag shows no value type (typer 0.29 prints `<bool>` for
every flag, `--help` included) and a usage line names an argument `PLAY`, not `{play}`."""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperOption

_option_type = TyperOption.display_type_rich


def _flag_has_no_type(self: TyperOption, ctx: Any) -> str | None:
    return None if self.is_flag or self.count else _option_type(self, ctx)


def _usage_name(self: TyperArgument) -> str:
    name = self.metavar or (self.name or "").upper()
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")


def install() -> None:
    """Once, before any help is printed; typer is pinned below 0.30 in pyproject.toml."""
    TyperOption.display_type_rich = _flag_has_no_type  # type: ignore[method-assign]
    TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]
