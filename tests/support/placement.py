"""A fleet for placement tests: a cloud provider's loopback double beside `local`, served
by one real worker (more can be started from its environment), policies set through the
CLI."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import tasks
from tasks.cli.main import app as cli
from tasks.constants import KEY_PROVIDER_CIRCUIT, KEY_START_RATE, EventKind
from tasks.sandbox.providers import REMOTE
from tasks.store.notify import redis_client
from tests.doubles.base import Double, discover
from tests.support.runs import FAST_RECOVERY, close_open_runs
from tests.support.stack import Worker, worker_env

CLOUD = "daytona"
ORG_PREFIX = "place-"


def org() -> str:
    return f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}"


def name() -> str:
    return f"p-{uuid.uuid4().hex[:8]}"


def cli_run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


@contextmanager
def fleet(tmp_path: Path, providers: str, *, double: dict[str, Any] | None = None,
          concurrency: int = 4, **extra: str) -> Iterator[tuple[Double, Worker]]:
    """The double (built with `double`'s options) and a ready worker serving `providers`;
    the worker's `env` starts more of the same. Runs of earlier fleets left open are closed
    first and this fleet's after (a start still queued for a provider would otherwise be
    taken by the next fleet's worker, and spend its double's refusals), and the start-rate
    buckets start afresh."""
    if importlib.util.find_spec(REMOTE[CLOUD].sdk) is None:
        pytest.skip(f"the {CLOUD} SDK is not installed")
    with discover()[CLOUD](tmp_path, **(double or {})) as running:
        env = worker_env(**{**FAST_RECOVERY, **running.env, **extra})
        env.update({"PLAYRUN_PROVIDERS": providers,
                    "PLAYRUN_GATEWAY_PUBLIC_URL": env["PLAYRUN_GATEWAY_URL"],
                    "PLAYRUN_SANDBOX_ROOT": str(tmp_path / "root")})
        close_open_runs(ORG_PREFIX)
        fresh_buckets(CLOUD, "local")
        w = Worker(env, concurrency=concurrency)
        try:
            w.wait_ready()
            yield running, w
        finally:
            w.stop()
            close_open_runs(ORG_PREFIX)


def fresh_buckets(*providers: str) -> None:
    """Start-rate buckets (and learned ceilings) and circuits as a new fleet finds them: an
    earlier test's refusals must not pace this one's starts, nor its failed creates (for
    PLAYRUN_PROVIDER_CIRCUIT_OPEN_S after them) pass this one's attempts to a fallback."""
    client = redis_client()
    for provider in providers:
        stale = list(client.scan_iter(match=f"{KEY_START_RATE}{{{provider}}}*"))
        client.delete(KEY_PROVIDER_CIRCUIT + provider, *stale)


def chosen(run_id: str) -> list[dict[str, Any]]:
    return [dict(e.data) for e in tasks.run_events(run_id)
            if e.kind == EventKind.PLACEMENT_CHOSEN]


def set_policy(*args: str) -> str:
    policy = name()
    result = cli_run("placement", "set", policy, *args)
    assert result.exit_code == 0, result.output
    return policy
