"""`playrun stats`: figures an operator reads, derived from the ledger and leases."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from tasks.acquisition import capacity, deferral
from tasks.broker.publish import StubPublisher
from tasks.maintenance.stats import collect
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tasks.store.fence import hold
from tests.support.paths import ROOT
from tests.support.runs import must_claim, new_run
from tests.support.stack import worker_env


def test_overruns_deferrals_and_held_leases_are_counted(
        pg_url: str, published: StubPublisher) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"
    capacity.set_limit(org, 0)
    observe = get_settings().model_copy(update={"capacity_mode": "observe"})
    before = collect(3600)
    f = must_claim(new_run(org), "A")
    with session_scope() as s:
        hold(s, f)
        assert capacity.reserve(s, f, org, observe).overrun
    g = must_claim(new_run(f"org-{uuid.uuid4().hex[:8]}"), "B")
    assert deferral.defer(g, "throttle", get_settings()) == "deferred"
    after = collect(3600)
    assert after.overruns_by_org.get(org) == 1
    assert after.leases_held_by_org.get(org) == 1
    assert after.deferrals_by_cause.get("throttle", 0) == \
        before.deferrals_by_cause.get("throttle", 0) + 1
    proc = subprocess.run([sys.executable, "-m", "tasks.cli.main", "stats", "--since", "1h"],
                          env=worker_env(), cwd=str(ROOT), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["overruns_by_org"][org] == 1 and shown["window_s"] == 3600
