"""The chaos suite itself, on its cheapest kind: `python bench/chaos.py` with a gateway
kill -9 and restart under 5 runs (one a sheet map), and a restart of this machine's
RabbitMQ under a stack that uses it as the broker; every invariant must hold and be
visible in its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


def test_a_gateway_restart_loses_doubles_and_leaks_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--kinds", "gateway", "-n", "5",
         "--spread-s", "4", "--fault-s", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "invariants" in done.stdout and "hold" in done.stdout
    result = json.loads(out.read_text())["gateway restart"]
    assert result["submitted"] == 5 and result["lost"] == 0, result
    assert result["doubled"] == 0 and result["stuck"] == 0, result
    assert result["executions"] == 5  # the side-effect count saw every play: it can see two
    assert (result["slots"], result["resources"], result["sandboxes"]) == (0, 0, 0), result
    # Run 4 maps its rows into a sheet: each read back once, right, and each fn ran once.
    assert (result["sheet_runs"], result["sheet_wrong"], result["sheet_doubled"]) == (1, 0, 0)
    assert result["recovery_s"] is not None and result["recovery_s"] < 60


def test_a_rabbitmq_restart_loses_and_doubles_nothing(tmp_path: Path) -> None:
    """The broker on this machine's RabbitMQ (a vhost of the suite's own), its application
    stopped for 2 s and started again under the load; running again after."""
    from tasks.testing import rabbitmq

    reason = rabbitmq.unavailable()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "chaos.json"
    try:
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "chaos.py"), "--kinds", "rabbitmq", "-n", "6",
             "--spread-s", "4", "--fault-s", "2", "--json", str(out)],
            capture_output=True, text=True, timeout=400, check=False)
    finally:
        rabbitmq.ensure_running()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())["RabbitMQ restart"]
    assert result["submitted"] == 6 and result["lost"] == 0, result
    assert result["doubled"] == 0 and result["stuck"] == 0 and result["unexpected"] == 0, result
    assert result["executions"] == 6 and not result["submit_errors"], result
    assert (result["slots"], result["resources"], result["sandboxes"]) == (0, 0, 0), result
    assert result["recovery_s"] is not None and result["recovery_s"] < 60
    assert rabbitmq.unavailable() is None  # the broker is left running


def test_an_outcome_other_than_the_plays_own_breaks_the_invariants() -> None:
    from bench.chaos import holds

    clean = {"no_fault_end": False, "recovery_s": 2.0, "unexpected": 0, "lost": 0,
             "doubled": 0, "stuck": 0, "slots": 0, "resources": 0, "sandboxes": 0,
             "sheet_wrong": 0, "sheet_doubled": 0}
    assert holds(clean)
    assert not holds({**clean, "unexpected": 1})  # a success a fault turned into a failure
    assert not holds({**clean, "recovery_s": 61.0})
    assert not holds({**clean, "recovery_s": None})
