"""Celery signals that start the metrics endpoints of workers and beat (never the hot path).

worker_init runs in the worker's main process before the pool forks: it switches to
multiprocess mode and serves the children's files; each child's exit is marked dead;
beat (standalone or embedded with -B) serves the state gauges.
"""

from __future__ import annotations

from typing import Any

from celery.signals import beat_init, worker_init, worker_process_shutdown, worker_shutdown
from prometheus_client import CollectorRegistry

from tasks.maintenance.state_metrics import StateCollector
from tasks.observe import serve as metrics_serve
from tasks.settings import get_settings


@worker_init.connect
def _worker_metrics(**_kwargs: Any) -> None:
    settings = get_settings()
    if settings.metrics_enabled:
        metrics_serve.serve("worker", settings, metrics_serve.start_multiprocess(settings))


@worker_process_shutdown.connect
def _child_exited(pid: int | None = None, **_kwargs: Any) -> None:
    if pid is not None and get_settings().metrics_enabled:
        metrics_serve.child_exited(pid)


@worker_shutdown.connect
def _worker_stopped(**_kwargs: Any) -> None:
    settings = get_settings()
    if settings.metrics_enabled:
        metrics_serve.stop("worker", settings)


@beat_init.connect
def _beat_metrics(**_kwargs: Any) -> None:
    settings = get_settings()
    if settings.metrics_enabled:
        registry = CollectorRegistry()
        registry.register(StateCollector(settings))
        metrics_serve.serve("beat", settings, registry)
