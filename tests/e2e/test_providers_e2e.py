"""Whole stacks on each cloud provider's double: real workers and the real gateway, the
provider's real SDK in the worker, the double answering as the provider would."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import tasks
from tasks.constants import (
    LABEL_GENERATION,
    LABEL_MANAGED,
    LABEL_RUN,
    RUNTIME_RUNNER_LOST,
    EventKind,
)
from tasks.sandbox import SandboxSpec
from tests.doubles.base import Double
from tests.support.cloud import CLOUD, cloud, stack_env
from tests.support.helpers import eventually
from tests.support.paths import PLAYS, ROOT
from tests.support.stack import Worker

pytestmark = pytest.mark.slow


@pytest.fixture(params=sorted(CLOUD))
def name(request: pytest.FixtureRequest) -> str:
    cloud(request.param)
    return str(request.param)


@contextmanager
def worker_on(double: Double, tmp_path: Path, **extra: str) -> Iterator[Worker]:
    w = Worker(stack_env(double, tmp_path / "root", **extra), concurrency=4)
    try:
        w.wait_ready()
        yield w
    finally:
        w.stop()


def org() -> str:
    return f"cloud-{uuid.uuid4().hex[:8]}"


def test_runs_succeed_and_leave_no_sandbox(name: str, pg_url: str, tmp_path: Path) -> None:
    with CLOUD[name](tmp_path) as double:
        with worker_on(double, tmp_path) as w:
            handle = tasks.submit_run(ROOT / "examples" / "plays" / "hello.py",
                                      input={"name": "cloud"}, org_id=org())
            result = handle.wait(timeout=90)
            assert result.status == "succeeded", (result, w.output()[-3000:])
            eventually(lambda: double.live_count() == 0, what="the sandbox to be deleted")
        assert double.creates() == 1


def test_twenty_runs_under_a_create_limit_all_succeed(name: str, pg_url: str,
                                                      tmp_path: Path) -> None:
    with CLOUD[name](tmp_path, creates_per_min=30) as double:
        with worker_on(double, tmp_path) as w:
            tenant = org()
            handles = [tasks.submit_run(ROOT / "examples" / "plays" / "noop.py", input={},
                                        org_id=tenant) for _ in range(20)]
            results = [h.wait(timeout=240) for h in handles]
            assert [r.status for r in results] == ["succeeded"] * 20, w.output()[-3000:]
        # Every refusal taught the start rate: the 429s stay a small share of creates.
        assert double.rejected_429() <= max(3, double.creates() // 4), \
            (double.rejected_429(), double.creates())


def test_a_provider_that_allows_two_live_sandboxes_never_sees_three(
        name: str, pg_url: str, tmp_path: Path) -> None:
    with CLOUD[name](tmp_path, max_live=2) as double:
        # A refused start waits its backoff: capped at 2 s, the five are done in seconds.
        with worker_on(double, tmp_path, PLAYRUN_DEFERRAL_MAX_MS="2000") as w:
            tenant = org()
            handles = [tasks.submit_run(PLAYS / "sleepy.py", input={"seconds": 1},
                                        org_id=tenant) for _ in range(5)]
            results = [h.wait(timeout=240) for h in handles]
            assert [r.status for r in results] == ["succeeded"] * 5, w.output()[-3000:]
        assert double.max_live_seen() <= 2


def test_a_runner_killed_in_its_sandbox_is_lost_and_its_sandbox_deleted(
        name: str, pg_url: str, tmp_path: Path) -> None:
    with CLOUD[name](tmp_path) as double, worker_on(double, tmp_path) as _w:
        run_id = tasks.submit_run(PLAYS / "forever.py", input={}, org_id=org()).id
        # The play's first log line arrived through the gateway: the runner is up.
        eventually(lambda: EventKind.PROGRESS in {e.kind for e in tasks.run_events(run_id)},
                   what="the runner to start", timeout=60)
        double.kill_runner(double.sandboxes()[0])
        result = tasks.RunHandle(run_id).wait(timeout=90)
        assert (result.status, result.code) == ("failed", RUNTIME_RUNNER_LOST), result
        eventually(lambda: double.live_count() == 0, what="the sandbox to be deleted")


def test_gc_deletes_an_orphan_with_playrun_labels(name: str, pg_url: str,
                                                  tmp_path: Path) -> None:
    with CLOUD[name](tmp_path) as double:
        prov = double.provider(tmp_path / "root")
        orphan = prov.create(SandboxSpec(labels={
            LABEL_MANAGED: "1", LABEL_RUN: uuid.uuid4().hex, LABEL_GENERATION: "1",
            "playrun.fleet": "default"}, files={}, key=f"pr-orphan-{uuid.uuid4().hex[:8]}"))
        assert orphan.sandbox_id in double.sandboxes()
        env = stack_env(double, tmp_path / "root")
        done = subprocess.run([sys.executable, "-m", "tasks.cli.main", "gc", "--grace", "0"],
                              env=env, cwd=str(ROOT), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"deleted {name}/{orphan.sandbox_id}: no owner: no such run" in done.stdout
        assert orphan.sandbox_id not in double.sandboxes()
