"""Where the repository and the plays the tests run are."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAYS = ROOT / "tests" / "plays"
NOOP = ROOT / "examples" / "plays" / "noop.py"
HELLO = ROOT / "examples" / "plays" / "hello.py"
