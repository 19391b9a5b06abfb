"""Run only by test_bare_machine.py, in a session whose configured servers do not answer:
the private servers the session started carry a real run end to end."""

from __future__ import annotations

import os

import tasks
from tests.support.paths import NOOP
from tests.support.session import PG_BASE, REDIS_BASE
from tests.support.stack import Worker, worker_env


def test_a_run_on_the_private_servers(pg_url: str, redis_url: str) -> None:
    assert os.environ["PLAYRUN_TEST_PG"] not in PG_BASE  # not the closed port it was given
    assert os.environ["PLAYRUN_TEST_REDIS"] != REDIS_BASE and redis_url.startswith(REDIS_BASE)
    worker = Worker(worker_env(), beat=False)
    try:
        worker.wait_ready()
        result = tasks.submit_run(NOOP, {}, org_id="bare").wait(timeout=60)
    finally:
        worker.stop()
    assert result.status == "succeeded", result
