"""End to end in containers: the CLI on the host submits the sample play; the worker in
the project's image, on pytest-celery's Redis broker, runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.e2e.docker.conftest import PG, engine_problem
from tests.support.paths import ROOT

PROBLEM = engine_problem()
pytestmark = [pytest.mark.docker, pytest.mark.slow,
              pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")]


def test_the_sample_play_runs_in_the_projects_image(celery_setup: Any,
                                                    playrun_postgres: Any) -> None:
    port = playrun_postgres.ports["5432/tcp"][0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYRUN_")}
    env.update({
        "PLAYRUN_REDIS_URL": celery_setup.broker.config()["host_url"],
        "PLAYRUN_DATABASE_URL": f"postgresql+psycopg://{PG['POSTGRES_USER']}:"
                                f"{PG['POSTGRES_PASSWORD']}@127.0.0.1:{port}/playrun",
    })
    proc = subprocess.run(
        [sys.executable, "-m", "tasks.cli.main", "submit", str(ROOT / "examples/plays/hello.py"),
         "--input", '{"name": "Docker"}', "--org", "docker", "--wait", "--timeout", "120"],
        env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["output"] == {"greeting": "Hello, Docker!", "shout": "DOCKER"}
    assert "playrun.start_attempt" in celery_setup.worker.logs()
