"""The runner as a real subprocess in a scratch sandbox directory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.runner import copy_runner, failed, run_play


def test_success_returns_json_output(tmp_path: Path) -> None:
    src = "def run(ctx, input):\n    return {'hello': input['name'], 'n': [1, 2.5, None]}\n"
    result, _ = run_play(tmp_path, src, b'{"name": "Ada"}')
    assert result == {"status": "succeeded", "output": {"hello": "Ada", "n": [1, 2.5, None]}}
    assert not list(tmp_path.glob(".*.tmp"))


def test_ctx_log_events_in_order_and_ctx_attributes(tmp_path: Path) -> None:
    src = (
        "def run(ctx, input):\n"
        "    for i in range(5):\n"
        "        ctx.log('step', i=i, odd={1, 2})\n"
        "    return [ctx.run_id, ctx.generation, ctx.org_id]\n"
    )
    env = {"PLAYRUN_RUN_ID": "run-1", "PLAYRUN_GENERATION": "3", "PLAYRUN_ORG_ID": "acme"}
    result, _ = run_play(tmp_path, src, env=env)
    assert result["output"] == ["run-1", 3, "acme"]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5]
    assert [e["fields"]["i"] for e in events] == [0, 1, 2, 3, 4]
    assert all(e["kind"] == "progress" and e["message"] == "step" for e in events)
    assert events[0]["fields"]["odd"] == "{1, 2}"  # non-JSON values become repr strings
    assert isinstance(events[0]["t"], float)


def test_events_are_bounded(tmp_path: Path) -> None:
    src = (
        "def run(ctx, input):\n"
        "    ctx.log('m' * 100_000, big='x' * 100_000)\n"
        "    for i in range(700):\n"
        "        ctx.log('y' * 15_000)\n"
        "    return 1\n"
    )
    result, _ = run_play(tmp_path, src)
    assert result["status"] == "succeeded"
    lines = (tmp_path / "events.jsonl").read_bytes().splitlines()
    assert all(len(line) <= 16 * 1024 for line in lines)
    first = json.loads(lines[0])
    assert first["truncated"] is True and first["message"].startswith("mmm")
    assert sum(len(line) + 1 for line in lines) <= 8 * 1024 * 1024
    assert json.loads(lines[-1])["kind"] == "dropped"


def test_syntax_error_is_play_invalid_with_line(tmp_path: Path) -> None:
    result, _ = run_play(tmp_path, "x = 1\n\ndef run(ctx, input)\n    return 1\n")
    error = failed(result, "PLAY_INVALID")
    assert "SyntaxError" in error and "line 3" in error


@pytest.mark.parametrize(
    "source",
    [None, b"\xff\xfe not utf-8", "run = 42\n", "def other(ctx, input):\n    return 1\n"],
    ids=["missing", "undecodable", "not-callable", "no-run"],
)
def test_unloadable_play_is_play_invalid(tmp_path: Path, source: str | bytes | None) -> None:
    result, _ = run_play(tmp_path, source)
    failed(result, "PLAY_INVALID")


def test_raise_is_play_error_with_message_and_traceback(tmp_path: Path) -> None:
    src = ("def helper():\n    raise ValueError('bad domain x.y')\n\n"
           "def run(ctx, input):\n    helper()\n")
    result, _ = run_play(tmp_path, src)
    error = failed(result, "PLAY_ERROR")
    assert error.startswith("ValueError: bad domain x.y")
    assert 'File "play.py", line 2, in helper' in error
    assert "runner.py" not in error


def test_long_error_is_bounded(tmp_path: Path) -> None:
    src = "def run(ctx, input):\n    raise RuntimeError('e' * 100_000)\n"
    result, _ = run_play(tmp_path, src)
    assert len(failed(result, "PLAY_ERROR")) <= 8 * 1024


@pytest.mark.parametrize(
    "expr", ["sys.exit(3)", "raise KeyboardInterrupt()", "raise SystemExit('bye')"]
)
def test_exit_and_interrupt_are_play_errors(tmp_path: Path, expr: str) -> None:
    src = f"import sys\n\ndef run(ctx, input):\n    {expr}\n"
    result, _ = run_play(tmp_path, src)
    error = failed(result, "PLAY_ERROR")
    assert error.split(":")[0] in ("SystemExit", "KeyboardInterrupt")


def test_top_level_raise_is_play_error(tmp_path: Path) -> None:
    result, _ = run_play(tmp_path, "import no_such_module_xyz\n\ndef run(ctx, input):\n    pass\n")
    assert "ModuleNotFoundError" in failed(result, "PLAY_ERROR")


@pytest.mark.parametrize(
    "expr", ["{1, 2}", "float('nan')", "{'x': float('inf')}", "object()", "{(1, 2): 3}"]
)
def test_non_json_output_is_output_invalid(tmp_path: Path, expr: str) -> None:
    result, _ = run_play(tmp_path, f"def run(ctx, input):\n    return {expr}\n")
    failed(result, "OUTPUT_INVALID")


def test_oversized_output_is_output_invalid(tmp_path: Path) -> None:
    result, _ = run_play(tmp_path, "def run(ctx, input):\n    return 'a' * (1024 * 1024 + 1)\n")
    assert "limit" in failed(result, "OUTPUT_INVALID")


def test_lone_surrogate_output_still_valid_json(tmp_path: Path) -> None:
    result, _ = run_play(tmp_path, "def run(ctx, input):\n    return 'a\\udc80b'\n")
    assert result == {"status": "succeeded", "output": "a\udc80b"}


def test_printing_megabytes_is_bounded(tmp_path: Path) -> None:
    src = (
        "import sys\n"
        "def run(ctx, input):\n"
        "    line = 'p' * 999\n"
        "    for _ in range(20_000):\n"
        "        print(line)\n"
        "    sys.stderr.write('e' * 10)\n"
        "    return 'done'\n"
    )
    result, proc = run_play(tmp_path, src)
    assert result == {"status": "succeeded", "output": "done"}
    log = (tmp_path / "stdout.log").read_bytes()
    assert 1024 * 1024 <= len(log) <= 1024 * 1024 + 200
    assert log.rstrip().endswith(b"bytes dropped]")
    assert len(proc.stdout) + len(proc.stderr) < 1024


def test_infinite_loop_is_run_timeout(tmp_path: Path) -> None:
    start = time.monotonic()
    result, _ = run_play(
        tmp_path, "def run(ctx, input):\n    while True:\n        pass\n", timeout=1
    )
    assert "time limit" in failed(result, "RUN_TIMEOUT")
    assert time.monotonic() - start < 5


def test_swallowed_timeout_is_still_run_timeout(tmp_path: Path) -> None:
    src = (
        "import time\n"
        "def run(ctx, input):\n"
        "    try:\n"
        "        time.sleep(30)\n"
        "    except BaseException:\n"
        "        return 'survived'\n"
    )
    result, _ = run_play(tmp_path, src, timeout=0.5)
    failed(result, "RUN_TIMEOUT")


def test_ignored_sigalrm_is_settled_by_the_watchdog(tmp_path: Path) -> None:
    src = (
        "import signal, threading\n"
        "def run(ctx, input):\n"
        "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "    threading.Event().wait()\n"
    )
    start = time.monotonic()
    result, _ = run_play(tmp_path, src, timeout=0.5)
    failed(result, "RUN_TIMEOUT")
    assert time.monotonic() - start < 10


def test_leftover_threads_do_not_hold_the_runner(tmp_path: Path) -> None:
    src = (
        "import threading\n"
        "def run(ctx, input):\n"
        "    threading.Thread(target=threading.Event().wait).start()\n"
        "    return 1\n"
    )
    result, _ = run_play(tmp_path, src)  # run_play's 60 s subprocess timeout would fire
    assert result["output"] == 1


@pytest.mark.parametrize("data", [b"{not json", b"\xff\xfe", b""])
def test_bad_input_is_input_invalid(tmp_path: Path, data: bytes) -> None:
    result, _ = run_play(tmp_path, "def run(ctx, input):\n    return 1\n", data)
    failed(result, "INPUT_INVALID")


def test_exit_code_nonzero_when_result_cannot_be_written(tmp_path: Path) -> None:
    # A non-empty directory where result.json should go: the atomic rename must fail.
    (tmp_path / "result.json").mkdir()
    (tmp_path / "result.json" / "x").write_text("")
    copy_runner(tmp_path)
    (tmp_path / "play.py").write_text("def run(ctx, input):\n    return 1\n")
    (tmp_path / "input.json").write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-B", "runner.py", "--timeout", "5"],
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert b"cannot write result.json" in proc.stderr


def test_forked_child_does_not_settle(tmp_path: Path) -> None:
    src = (
        "import os, time\n"
        "def run(ctx, input):\n"
        "    if os.fork() == 0:\n"
        "        return 'child'\n"
        "    time.sleep(0.3)\n"
        "    return 'parent'\n"
    )
    result, _ = run_play(tmp_path, src)
    assert result == {"status": "succeeded", "output": "parent"}
