"""Real processes for the metrics and Flower tests: beat, Flower, and reading endpoints."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tasks.host.processes import die_with_parent, stop_group
from tests.support.paths import ROOT


class Proc:
    """A child process in its own group, its output in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], prefix: str) -> None:
        self.log_path = Path(tempfile.mktemp(prefix=prefix, suffix=".log"))
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, env=env, cwd=str(ROOT), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=die_with_parent)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = 15) -> None:
        stop_group(self.proc, sig)
        self.log.close()


def beat(env: dict[str, str]) -> Proc:
    return Proc([sys.executable, "-m", "celery", "-A", "tasks", "beat", "--loglevel=INFO"],
                env, "playrun-beat-")


def flower(env: dict[str, str], port: int) -> Proc:
    return Proc([sys.executable, "-m", "celery", "-A", "tasks", "flower", "--address=127.0.0.1",
                 f"--port={port}"], env, "playrun-flower-")


def endpoint(env: dict[str, str], kind: str, proc: subprocess.Popen[bytes],
             timeout: float = 30.0) -> str:
    """The URL a process wrote once its metrics listener was up (README "Metrics")."""
    path = Path(env["PLAYRUN_METRICS_DIR"]) / f"{kind}-{proc.pid}.url"
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no metrics URL from the {kind} at {path}")
        time.sleep(0.05)
    return path.read_text().strip()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an endpoint, parsed by prometheus_client's own parser."""
    text = httpx.get(url, timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def summed(*scrapes: dict[tuple[str, tuple[tuple[str, str], ...]], float],
           prefix: str = "playrun_") -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples of several endpoints added up (a fact is counted by whichever process
    made it true), without those that are zero and the histogram buckets."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for one in scrapes:
        for key, v in one.items():
            if key[0].startswith(prefix) and not key[0].endswith(("_bucket", "_created")):
                out[key] = out.get(key, 0.0) + v
    return {k: v for k, v in out.items() if v}
