"""Redis topologies for tests (tasks/testing/topologies.py) and how to count starts."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tasks.testing.topologies import Cluster, SentinelGroup


def most_in_window(times: list[float], window_s: float) -> int:
    """The most starts any window of `window_s` seconds holds."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def started(topology: SentinelGroup | Cluster) -> Iterator[Any]:
    """For a fixture: the topology started, and stopped after the test."""
    if not (shutil.which("redis-server") and shutil.which("redis-cli")):
        pytest.skip("needs redis-server and redis-cli (Debian: redis-server, redis-tools)")
    try:
        yield topology.start()
    finally:
        topology.stop()
