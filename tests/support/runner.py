"""The sandbox runner as a real subprocess in a scratch directory (no provider)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tasks.acquisition.sandbox import runner_files


def copy_runner(directory: Path, without: tuple[str, ...] = ()) -> None:
    """The runner's files as the host uploads them into a sandbox."""
    for name, data in runner_files().items():
        if name not in without:
            (directory / name).write_bytes(data)


def run_play(
    directory: Path,
    source: str | bytes | None,
    input_data: bytes = b"{}",
    *,
    timeout: float = 10.0,
    env: dict[str, str] | None = None,
    without: tuple[str, ...] = (),
) -> tuple[dict[str, Any], subprocess.CompletedProcess[bytes]]:
    copy_runner(directory, without)
    if source is not None:
        data = source.encode() if isinstance(source, str) else source
        (directory / "play.py").write_bytes(data)
    (directory / "input.json").write_bytes(input_data)
    proc = subprocess.run(
        [sys.executable, "-s", "-E", "-B", "runner.py", "--timeout", str(timeout)],
        cwd=directory,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads((directory / "result.json").read_bytes()), proc


def failed(result: dict[str, Any], code: str) -> str:
    assert result["status"] == "failed", result
    assert result["code"] == code, result
    assert set(result) == {"status", "code", "error"}
    return str(result["error"])
