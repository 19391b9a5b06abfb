"""Whole stacks on a cloud provider's double: which doubles there are, and a worker's
settings that point it at one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tasks.sandbox.providers import REMOTE
from tests.doubles.base import Double, discover
from tests.support.runs import FAST_RECOVERY
from tests.support.stack import worker_env

CLOUD = {name: running for name, running in discover().items() if name in REMOTE}


def cloud(name: str) -> None:
    """Skips the test when the provider's SDK is not installed."""
    if importlib.util.find_spec(REMOTE[name].sdk) is None:
        pytest.skip(f"the {name} SDK is not installed (pip install 'playrun[{name}]')")


def stack_env(double: Double, root: Path, **extra: str) -> dict[str, str]:
    """A worker's settings on the double; the runner reaches the gateway at its public URL."""
    env = worker_env(**FAST_RECOVERY, **double.env, **extra)
    env.update({"PLAYRUN_SANDBOX_PROVIDER": double.name,
                "PLAYRUN_GATEWAY_PUBLIC_URL": env["PLAYRUN_GATEWAY_URL"],
                "PLAYRUN_SANDBOX_ROOT": str(root)})
    return env
