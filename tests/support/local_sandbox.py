"""Helpers and the provider fixture shared by the local-provider test modules."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks.acquisition.sandbox import runner_files
from tasks.sandbox import LocalProvider, ProcessStatus, SandboxSpec, supervisor_proc
from tasks.sandbox.local import pid_namespace_command, probe_strict
from tasks.settings import get_settings

RUNNER = runner_files()  # every runner file, by its name in the sandbox
# Every test runs in strict isolation (bubblewrap) and once in process mode; the process-tree
# tests also with process mode's two layouts (PID namespace, plain process group).
TREE_MODES = ["strict", "pidns", "pgroup"]


@pytest.fixture(params=["strict", "process"])
def provider(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalProvider]:
    mode: str = request.param
    root = tmp_path / "sandboxes"
    if mode == "strict":
        problem = probe_strict(get_settings(), root)
        if problem:
            pytest.skip(f"strict isolation unavailable: {problem}")
        prov = LocalProvider(root, isolation="strict")
    elif mode == "pidns":
        if not pid_namespace_command():
            pytest.skip("no PID namespaces on this machine")
        prov = LocalProvider(root, pid_namespace=True)
    elif mode == "pgroup":
        prov = LocalProvider(root, pid_namespace=False)
    else:
        prov = LocalProvider(root, isolation="process")
    yield prov
    for ref in prov.list({}):
        prov.delete(ref.sandbox_id)


def is_strict(prov: LocalProvider) -> bool:
    return prov.isolation == "strict"


def wait_exit(prov: LocalProvider, sandbox_id: str, within: float = 15.0) -> ProcessStatus:
    deadline = time.monotonic() + within
    while True:
        status = prov.poll(sandbox_id)
        if status.state != "running" or time.monotonic() > deadline:
            return status
        time.sleep(0.01)


def play_sandbox(prov: LocalProvider, source: str, input_data: Any = None, **spec: Any) -> str:
    files = {
        **RUNNER,
        "play.py": source.encode(),
        "input.json": json.dumps(input_data).encode(),
    }
    return prov.create(SandboxSpec(labels={"playrun": "1"}, files=files, **spec)).sandbox_id


def run_play(
    prov: LocalProvider,
    source: str,
    input_data: Any = None,
    *,
    env: dict[str, str] | None = None,
    **spec: Any,
) -> tuple[str, ProcessStatus, dict[str, Any]]:
    sid = play_sandbox(prov, source, input_data, **spec)
    argv = ["{python}", "runner.py", "--timeout", "10"]
    prov.exec_detached(sid, argv, env=env or {}, timeout_s=20)
    status = wait_exit(prov, sid)
    read = prov.read_file(sid, "result.json", max_bytes=2 << 20)
    assert read is not None, prov.read_file(sid, ".playrun/console.log", max_bytes=10000)
    return sid, status, json.loads(read.data)


def find_pids(marker: str) -> set[int]:
    """Outer pids of processes whose command line contains marker (works across PID ns)."""
    return {
        int(e.name)
        for e in os.scandir("/proc")
        if e.name.isdigit() and any(marker in a for a in supervisor_proc.read_cmdline(int(e.name)))
    }


def wait_for(predicate: Any, within: float = 10.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")
