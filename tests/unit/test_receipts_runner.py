"""ctx.step in a real runner subprocess without a gateway (a runner started by hand): the
same checks and codes as in a sandbox, nothing kept. The gateway path is tested in
test_receipts_gateway.py and end to end in test_receipts_e2e.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.runner import failed, run_play


def run_steps(directory: Path, body: str) -> dict[str, Any]:
    source = "def run(ctx, input):\n" + "".join(f"    {line}\n" for line in body.splitlines())
    result, _ = run_play(directory, source, timeout=20)
    return result


def test_a_step_returns_its_output_as_json(tmp_path: Path) -> None:
    result = run_steps(tmp_path, "return ctx.step('k', lambda: {'t': (1, 2), 'n': None})")
    assert result == {"status": "succeeded", "output": {"t": [1, 2], "n": None}}


@pytest.mark.parametrize("key", ["''", "'   '", "'x' * 100_000", "None", "7", "'a\\x00b'"])
def test_a_bad_key_fails_the_run_with_its_code(tmp_path: Path, key: str) -> None:
    error = failed(run_steps(tmp_path, f"return ctx.step({key}, lambda: 1)"),
                   "STEP_KEY_INVALID")
    assert "StepError: STEP_KEY_INVALID" in error


def test_a_bad_ttl_fails_the_run(tmp_path: Path) -> None:
    failed(run_steps(tmp_path, "return ctx.step('k', lambda: 1, ttl=-5)"), "STEP_INVALID")


@pytest.mark.parametrize(("fn", "why"), [
    ("lambda: {1, 2}", "not JSON-serialisable"),
    ("lambda: float('nan')", "not JSON-serialisable"),
    ("lambda: 'x' * (256 * 1024)", "the limit is 262144"),
])
def test_output_that_cannot_be_kept_fails_the_run_output_invalid(
        tmp_path: Path, fn: str, why: str) -> None:
    assert why in failed(run_steps(tmp_path, f"return ctx.step('k', {fn})"), "OUTPUT_INVALID")


def test_a_step_that_calls_itself_raises_instead_of_deadlocking(tmp_path: Path) -> None:
    error = failed(run_steps(tmp_path, "return ctx.step('k', lambda: ctx.step('k', int))"),
                   "STEP_RECURSIVE")
    assert "calls itself" in error


def test_nested_steps_with_other_keys_are_fine(tmp_path: Path) -> None:
    result = run_steps(tmp_path, "return ctx.step('a', lambda: [ctx.step('b', lambda: 2)])")
    assert result["output"] == [2]


def test_a_raising_fn_is_play_error_with_its_message(tmp_path: Path) -> None:
    error = failed(run_steps(tmp_path, "return ctx.step('k', lambda: 1 / 0)"), "PLAY_ERROR")
    assert "ZeroDivisionError" in error


def test_a_play_may_catch_a_step_error(tmp_path: Path) -> None:
    result = run_steps(tmp_path, "try:\n    ctx.step('', int)\nexcept Exception as exc:\n"
                                 "    return exc.code")
    assert result == {"status": "succeeded", "output": "STEP_KEY_INVALID"}


def test_without_the_steps_module_ctx_step_says_so(tmp_path: Path) -> None:
    result, _ = run_play(tmp_path, "def run(ctx, input):\n    return ctx.step('k', int)\n",
                         without=("playrun_steps.py",))
    assert "playrun_steps.py" in failed(result, "PLAY_ERROR")
