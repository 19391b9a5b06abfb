"""A real Flower process against a real worker: its API lists the tasks of a submitted run
by name with the run id, never a token or the run's input, and refuses requests without
the basic auth the README shows."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

import tasks
from models import Attempt
from tasks.constants import TASK_RELEASE_ATTEMPT, TASK_RELEASE_ATTEMPTS, TASK_START_ATTEMPT
from tasks.host.processes import free_port
from tasks.store.db import session_scope
from tests.support.helpers import eventually
from tests.support.metrics import Proc, flower
from tests.support.paths import ROOT
from tests.support.stack import Worker, worker_env

pytest.importorskip("flower", reason="Flower is the `flower` extra: pip install -e '.[flower]'")
pytestmark = pytest.mark.slow
HELLO = ROOT / "examples" / "plays" / "hello.py"
AUTH = ("operator", "pw-" + uuid.uuid4().hex[:12])


@pytest.fixture(scope="module")
def flower_worker(pg_url: str) -> Iterator[Worker]:
    env = worker_env(FLOWER_BASIC_AUTH=f"{AUTH[0]}:{AUTH[1]}")
    worker = Worker(env, beat=True)
    worker.flower_env = env  # type: ignore[attr-defined]
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def flower_url(flower_worker: Worker) -> Iterator[str]:
    env = flower_worker.flower_env  # type: ignore[attr-defined]
    port = free_port()
    proc: Proc = flower(env, port)
    url = f"http://127.0.0.1:{port}"
    try:
        # Flower sees what workers report from the moment it is connected: wait until it
        # has seen beat's periodic tasks go through the worker.
        eventually(lambda: any(t["name"] == "playrun.reap" for t in _tasks(url).values()),
                   timeout=60, every=0.5, what="Flower to see the worker's tasks")
        yield url
    finally:
        proc.stop()
        print("--- flower\n", proc.output()[-3000:])  # shown by pytest only on failure


def _tasks(url: str, **params: str) -> dict[str, Any]:
    try:
        reply = httpx.get(f"{url}/api/tasks", params=params, auth=AUTH, timeout=10)
    except httpx.HTTPError:
        return {}
    return dict(reply.json()) if reply.status_code == 200 else {}


def test_flower_lists_a_runs_tasks_by_name_with_its_id_and_nothing_secret(
        flower_url: str) -> None:
    secret_input = "input-secret-" + uuid.uuid4().hex
    run = tasks.submit_run(HELLO, input={"name": secret_input}, org_id="flower-org")
    assert run.wait(timeout=60).status == "succeeded"

    def of_the_run() -> dict[str, dict[str, Any]]:
        found = {t["name"]: t for t in _tasks(flower_url).values()
                 if run.id in str(t.get("args"))}
        return found if {TASK_START_ATTEMPT, TASK_RELEASE_ATTEMPTS} <= found.keys() else {}

    found = eventually(of_the_run, timeout=60, every=0.5, what="the run's tasks in Flower")
    assert found[TASK_START_ATTEMPT]["args"] == f"run_id={run.id}"
    # The gateway sends the releases that settle within a window in one task.
    assert found[TASK_RELEASE_ATTEMPTS]["args"] == f"runs={run.id}"
    assert found[TASK_START_ATTEMPT]["state"] == "SUCCESS"
    with session_scope() as s:
        token = s.scalar(sa.select(Attempt.lease_token).where(Attempt.run_id == run.id))
    assert token
    everything = httpx.get(f"{flower_url}/api/tasks", auth=AUTH, timeout=10).text
    assert run.id in everything
    assert token not in everything
    assert secret_input not in everything
    one = httpx.get(f"{flower_url}/api/task/info/{found[TASK_RELEASE_ATTEMPTS]['uuid']}",
                    auth=AUTH, timeout=10)
    assert one.status_code == 200 and token not in one.text


def test_flower_refuses_requests_without_the_basic_auth(flower_url: str) -> None:
    assert httpx.get(f"{flower_url}/api/tasks", timeout=10).status_code == 401
    wrong = httpx.get(f"{flower_url}/api/tasks", auth=(AUTH[0], "nope"), timeout=10)
    assert wrong.status_code == 401
    assert httpx.get(f"{flower_url}/api/tasks", auth=AUTH, timeout=10).status_code == 200


def test_workers_answer_inspect_commands_without_the_token(flower_worker: Worker) -> None:
    """Flower's worker pages ask workers what they hold (`scheduled`, `query_task`, ...):
    a release waiting on a countdown is shown by run id, never with its holder token."""
    token = "holder-" + uuid.uuid4().hex
    run_id = uuid.uuid4().hex
    sent = tasks.app.send_task(TASK_RELEASE_ATTEMPT, args=[run_id, 1, token], queue="playrun",
                               countdown=60)
    inspect = tasks.app.control.inspect([flower_worker.name], timeout=2)
    try:
        def waiting() -> list[dict[str, Any]]:
            return [e for e in (inspect.scheduled() or {}).get(flower_worker.name, [])
                    if e["request"]["id"] == sent.id]

        entry = eventually(waiting, timeout=30, every=0.5, what="the release to be scheduled")
        assert entry[0]["request"]["args"] == f"run_id={run_id}, generation=1"
        queried = inspect.query_task([sent.id]) or {}
        assert run_id in str(queried) and token not in str(queried)
        assert token not in str(entry)
    finally:
        tasks.app.control.revoke(sent.id)
