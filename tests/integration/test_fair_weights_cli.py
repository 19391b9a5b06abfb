"""`playrun capacity set ORG N --weight W`: checked, stored, shown; what the relay reads."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from tasks.acquisition import capacity
from tasks.acquisition.fairshare import view
from tasks.errors import InputInvalidError
from tasks.store.db import session_scope
from tests.support.paths import ROOT
from tests.support.stack import worker_env


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tasks.cli.main", "capacity", *args],
                          env={**worker_env(), "COLUMNS": "200"}, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60)


def test_weight_is_set_shown_and_kept_by_a_new_limit(pg_url: str) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"
    shown = cli("set", org, "7", "--weight", "3")
    assert shown.returncode == 0, shown.stderr
    assert "start order fair" in shown.stdout
    row = next(line for line in shown.stdout.splitlines() if org in line)
    assert row.split("\t") == [org, "7", "0", "0", "3"]
    again = cli("set", org, "9")  # no --weight: the weight stays
    row = next(line for line in again.stdout.splitlines() if org in line)
    assert row.split("\t") == [org, "9", "0", "0", "3"]
    with session_scope(readonly=True) as session:
        assert view.weights(session, [org, "nobody"]) == {org: 3, "nobody": 1}


@pytest.mark.parametrize("bad", ["0", "1001", "-1", "1.5", "abc", "1e3"])
def test_a_weight_out_of_bounds_is_refused_with_a_code(pg_url: str, bad: str) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"
    refused = cli("set", org, "7", f"--weight={bad}")
    assert refused.returncode != 0
    assert "INPUT_INVALID" in refused.stderr + refused.stdout
    assert org not in cli("show").stdout  # nothing was stored
    with pytest.raises(InputInvalidError):
        capacity.set_limit(org, 7, weight=int(bad) if bad.lstrip("-").isdigit() else bad)  # type: ignore[arg-type]

