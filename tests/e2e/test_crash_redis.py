"""Redis restarted under a live fleet (a private valkey-server, since the machine's Redis
is shared): queued and in-flight runs are neither lost nor stuck."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import tasks
from tasks.testing import RedisServer
from tests.support.helpers import eventually, kinds
from tests.support.paths import PLAYS, ROOT
from tests.support.runs import FAST_RECOVERY
from tests.support.stack import Worker, worker_env

pytestmark = pytest.mark.slow
RECOVERY = {
    **FAST_RECOVERY,
    "PLAYRUN_SWEEP_INTERVAL_S": "0.5",
    "PLAYRUN_OUTBOX_RESEND_AFTER_S": "2",
    "PLAYRUN_WORKER_WATCHDOG_S": "6",
}


class Supervisor:
    """What docker's `restart: unless-stopped` or systemd does: start a worker again
    when it exits. Celery on Redis may exit or wedge on a broker restart; the watchdog
    turns a wedge into an exit."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.workers = [Worker(env, beat=True)]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self.workers[0].wait_ready()
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopping.wait(0.2):
            if self.workers[-1].proc.poll() is not None:
                self.workers.append(Worker(self.env, beat=True))

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        for w in self.workers:
            w.stop()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start().wait_ready()
    yield server
    server.stop()


def submit(env: dict[str, str], play: Path, input: str, *, broker_up: bool = True) -> str:
    proc = subprocess.run([sys.executable, "-m", "tasks.cli.main", "submit", str(play), "--input",
                           input, "--org", f"org-{uuid.uuid4().hex[:6]}"], env=env,
                          cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    if broker_up:
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().splitlines()[-1]
    # Broker down: one coded line naming the committed run, which the sweep sends later.
    assert proc.returncode == 2 and proc.stderr.startswith("error BROKER_UNAVAILABLE: "), \
        proc.stderr
    found = re.search(r"run ([0-9a-f]{32}) is committed", proc.stderr)
    assert found, proc.stderr
    return found.group(1)


def test_redis_restart_mid_run_and_while_submitting(pg_url: str,
                                                     private_redis: RedisServer) -> None:
    env = worker_env(PLAYRUN_REDIS_URL=f"{private_redis.url}/0", **RECOVERY)
    fleet = Supervisor(env)
    try:
        fleet.start()
        in_flight = submit(env, PLAYS / "sleepy.py", '{"seconds": 3}')
        eventually(lambda: "sandbox.live" in kinds(in_flight), what="the run to start")
        private_redis.stop(signal.SIGKILL)  # every queued and unacked message is gone with it
        # Submitted while the broker is down: the commit stands, the publish fails.
        while_down = submit(env, ROOT / "examples" / "plays" / "noop.py", "{}",
                            broker_up=False)
        private_redis.start().wait_ready()
        for run_id in (in_flight, while_down):
            eventually(lambda rid=run_id: tasks.get_run(rid).status == "succeeded",
                       timeout=90, what=f"run {run_id} to succeed after the restart: "
                       f"{tasks.get_run(run_id)} {kinds(run_id)}")
    finally:
        fleet.stop()
    assert len(tasks.get_run(in_flight).attempts) == 1
    assert kinds(in_flight).count("run.succeeded") == 1
