"""The Lua scripts of the fleet-wide budgets, each after the shared prelude (lua/)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class Script:
    name: str
    body: str
    sha: str


def _lua(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


@cache
def script(name: str) -> Script:
    body = _lua("prelude") + _lua(name)
    return Script(name, body, hashlib.sha1(body.encode("utf-8")).hexdigest())
