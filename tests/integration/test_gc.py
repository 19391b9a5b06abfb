"""Sandbox GC (docs/design.md) against sandboxes planted directly through the local provider.

GC lists sandboxes by the `playrun` label and deletes those whose run is terminal, whose
attempt is fenced out, or that no record owns, once past the grace period; it keeps the
sandbox of a live attempt, young ones, and anything that is not ours.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import sqlalchemy as sa

import tasks
from models import RuntimeResource
from tasks.acquisition import capacity
from tasks.acquisition.claim import Claimed
from tasks.acquisition.sandbox import labels_for, record_for_cleanup, record_live
from tasks.constants import LABEL_FLEET, LABEL_GENERATION, LABEL_MANAGED, LABEL_RUN, RunStatus
from tasks.maintenance.gc import collect
from tasks.maintenance.reaper import ReapReport, retry_releases
from tasks.sandbox import SandboxProvider, SandboxRef, SandboxSpec, get_provider
from tasks.settings import get_settings
from tasks.settlement.outcome import Outcome
from tasks.settlement.terminal import settle
from tasks.store.db import session_scope
from tasks.store.fence import Fence, hold
from tests.support.paths import ROOT
from tests.support.runs import closes_open_runs, must_claim, new_run, org_namer, supersede
from tests.support.stack import worker_env

ORG_PREFIX = "gc-"

org = org_namer(ORG_PREFIX)
_no_open_runs_left = closes_open_runs(ORG_PREFIX)


def plant(prov: SandboxProvider, labels: dict[str, str]) -> SandboxRef:
    """A sandbox made straight at the provider, as a crashed worker would leave it."""
    return prov.create(SandboxSpec(labels=labels, files={"note.txt": b"planted"}))


def orphan_labels(run_id: str | None = None, generation: str = "1") -> dict[str, str]:
    return {LABEL_MANAGED: "1", LABEL_RUN: run_id or uuid.uuid4().hex,
            LABEL_GENERATION: generation}


def owned(prov: SandboxProvider, fence: Fence, org_id: str) -> SandboxRef:
    """A sandbox created for the attempt and recorded live under its fence."""
    return plant(prov, labels_for(Claimed(fence, org_id, "", {}, False), None))


def listed(prov: SandboxProvider) -> set[str]:
    return {r.sandbox_id for r in prov.list({})}


def resource_state(sandbox_id: str) -> str | None:
    with session_scope() as session:
        return session.scalar(sa.select(RuntimeResource.state)
                              .where(RuntimeResource.sandbox_id == sandbox_id))


def test_gc_deletes_what_nothing_current_owns_and_keeps_the_rest(
    pg_url: str, tmp_path: Path
) -> None:
    prov = get_provider("local", tmp_path / "sandboxes")
    unknown_run = plant(prov, orphan_labels())
    no_run_label = plant(prov, {LABEL_MANAGED: "1"})
    bad_generation = plant(prov, {**orphan_labels(), LABEL_GENERATION: "latest"})
    foreign = plant(prov, {"team": "data"})  # not ours: never listed by GC, never touched

    # A live attempt: recorded live under its fence, lease promoted with it.
    live_org = org()
    live_fence = must_claim(new_run(live_org))
    keep = owned(prov, live_fence, live_org)
    record_live(live_fence, keep)

    # A terminal run whose release never happened (the worker died after the terminal):
    # its sandbox is still recorded live and its capacity lease still held.
    done_org = org()
    done_run = new_run(done_org)
    done_fence = must_claim(done_run)
    with session_scope() as session:
        hold(session, done_fence)
        lease_id = capacity.reserve(session, done_fence, done_org, get_settings()).lease_id
    of_terminal = owned(prov, done_fence, done_org)
    record_live(done_fence, of_terminal, lambda s, ref: capacity.promote(
        s, done_fence, lease_id, ref.provider, ref.sandbox_id))
    assert settle(done_fence, Outcome(RunStatus.SUCCEEDED, output={}), reason="ended").won

    # A superseded attempt (generation 1) of a run now on generation 2.
    old_org = org()
    old_run = new_run(old_org)
    old_fence = must_claim(old_run)
    of_old_generation = owned(prov, old_fence, old_org)
    record_live(old_fence, of_old_generation)
    supersede(old_run)
    assert must_claim(old_run).generation == 2

    # The current attempt's sandboxes that it gave up or never recorded.
    cur_org = org()
    cur_fence = must_claim(new_run(cur_org))
    for_cleanup = owned(prov, cur_fence, cur_org)
    record_for_cleanup(cur_fence, for_cleanup, "reported after the attempt lost its fence")
    unrecorded = owned(prov, cur_fence, cur_org)

    ours = [unknown_run, no_run_label, bad_generation, keep, of_terminal, of_old_generation,
            for_cleanup, unrecorded]
    everything = {r.sandbox_id for r in ours} | {foreign.sandbox_id}
    assert listed(prov) == everything

    # Within the grace period nothing is touched: a sandbox may be between create and record.
    young = collect([prov], grace_s=3600)
    assert (young.listed, young.young, young.kept, young.deleted, young.failed) == \
        (len(ours), len(ours), 0, [], [])
    assert listed(prov) == everything

    report = collect([prov], grace_s=0)
    assert (report.listed, report.young, report.kept, report.failed) == (len(ours), 0, 1, [])
    why = {sid: reason for _, sid, reason in report.deleted}
    assert why == {
        unknown_run.sandbox_id: "no owner: no such run",
        no_run_label.sandbox_id: "no owner: unreadable generation label",
        bad_generation.sandbox_id: "no owner: unreadable generation label",
        of_terminal.sandbox_id: "run is succeeded",
        of_old_generation.sandbox_id: "attempt is fenced out",
        for_cleanup.sandbox_id: "recorded as cleanup",
        unrecorded.sandbox_id: "no record owns it",
    }
    assert all(prov_name == "local" for prov_name, _, _ in report.deleted)
    assert listed(prov) == {keep.sandbox_id, foreign.sandbox_id}
    assert not (tmp_path / "sandboxes" / of_terminal.sandbox_id).exists()
    # Records follow the provider; the owner's record and sandbox are untouched.
    assert resource_state(keep.sandbox_id) == "live"
    for ref in (of_terminal, of_old_generation, for_cleanup):
        assert resource_state(ref.sandbox_id) == "deleted", ref
    events = tasks.run_events(done_run)
    assert [e.data["sandbox_id"] for e in events if e.kind == "sandbox.deleted"] == \
        [of_terminal.sandbox_id]
    # With the sandbox gone, the reaper's release retry gives the terminal run's slot back.
    retry_releases(ReapReport())
    with session_scope() as session:
        assert capacity.in_use(session, done_org) == 0
    assert [e.data["lease_id"] for e in tasks.run_events(done_run)
            if e.kind == "capacity.released"] == [lease_id]

    # A fresh orphan is left alone until it is older than the grace period, then goes.
    fresh = plant(prov, orphan_labels())
    early = collect([prov], grace_s=10, now=fresh.created_at + 9.5)
    assert early.deleted == [] and early.young >= 1
    assert fresh.sandbox_id in listed(prov)
    late = collect([prov], grace_s=10, now=max(fresh.created_at, keep.created_at) + 10.5)
    assert (late.listed, late.young, late.kept) == (2, 0, 1)
    assert late.deleted == [("local", fresh.sandbox_id, "no owner: no such run")]
    assert listed(prov) == {keep.sandbox_id, foreign.sandbox_id}
    prov.delete(foreign.sandbox_id)


def _gc_cli(root: Path, *args: str) -> str:
    env = worker_env(PLAYRUN_SANDBOX_PROVIDER="local", PLAYRUN_SANDBOX_ROOT=str(root))
    proc = subprocess.run([sys.executable, "-m", "tasks.cli.main", "gc", *args], env=env,
                          cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_gc_cli_prints_what_it_did(pg_url: str, tmp_path: Path) -> None:
    root = tmp_path / "cli-sandboxes"
    prov = get_provider("local", root)
    org_id = org()
    fence = must_claim(new_run(org_id))
    keep = owned(prov, fence, org_id)
    record_live(fence, keep)
    orphan = plant(prov, orphan_labels())

    out = _gc_cli(root, "--grace", "3600")
    assert out.splitlines()[0] == \
        "listed 2, kept 0, too young 2, other fleets 0, deleted 0, failed 0", out
    assert listed(prov) == {keep.sandbox_id, orphan.sandbox_id}

    out = _gc_cli(root, "--grace", "0")
    lines = out.splitlines()
    assert lines[0] == "listed 2, kept 1, too young 0, other fleets 0, deleted 1, failed 0", out
    assert lines[1:] == [f"deleted local/{orphan.sandbox_id}: no owner: no such run"], out
    assert re.fullmatch(r"lsb-[0-9a-f]{16}", orphan.sandbox_id)
    assert listed(prov) == {keep.sandbox_id}


def test_gc_leaves_another_fleets_orphans_to_that_fleet(pg_url: str, tmp_path: Path) -> None:
    prov = get_provider("local", tmp_path / "fleets")
    theirs = plant(prov, {**orphan_labels(), LABEL_FLEET: "staging"})
    ours = plant(prov, {**orphan_labels(), LABEL_FLEET: "prod"})
    unlabelled = plant(prov, orphan_labels())  # made before fleets were labelled
    report = collect([prov], grace_s=0, fleet="prod")
    assert (report.listed, report.other_fleet) == (3, 1)
    assert {sid for _, sid, _ in report.deleted} == {ours.sandbox_id, unlabelled.sandbox_id}
    assert listed(prov) == {theirs.sandbox_id}


def test_a_delete_killed_midway_leaves_nothing_after_the_next_listing(tmp_path: Path) -> None:
    prov = get_provider("local", tmp_path / "half-deleted")
    ref = plant(prov, orphan_labels())
    control = tmp_path / "half-deleted" / ".control"
    # Where a SIGKILL between the two renames of a delete leaves the control record.
    (control / ref.sandbox_id).rename(control / f".deleting-{ref.sandbox_id}-0badf00d")
    prov.list({LABEL_MANAGED: "1"})
    assert sorted(p.name for p in control.iterdir()) == []
