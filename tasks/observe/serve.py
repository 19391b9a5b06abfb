"""The metrics endpoints: one HTTP listener per process kind, never the gateway's own port.

Each process that serves writes its URL to `<PLAYRUN_METRICS_DIR>/<kind>-<pid>.url` once
it listens (the way to find a port 0 listener), and logs it. A worker, and a gateway of
several processes, switch to prometheus_client's multiprocess mode: the children write to
`<PLAYRUN_METRICS_DIR>/<kind>-<pid>/`, which the main process empties at start, serves,
and removes at shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import Literal

from prometheus_client import CollectorRegistry, multiprocess, start_http_server, values

from tasks.host.processes import pid_alive
from tasks.observe import metrics
from tasks.settings import Settings, parse_addr

log = logging.getLogger("playrun.metrics")

Kind = Literal["worker", "beat", "gateway"]
_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def address(settings: Settings, kind: Kind) -> str:
    return {"worker": settings.metrics_worker_addr, "beat": settings.metrics_beat_addr,
            "gateway": settings.metrics_gateway_addr}[kind]


def url_file(settings: Settings, kind: Kind, pid: int) -> Path:
    return Path(settings.metrics_dir) / f"{kind}-{pid}.url"


def serve(kind: Kind, settings: Settings, registry: CollectorRegistry) -> str | None:
    """Listen in a daemon thread. A port already taken is logged, not fatal: the process
    does its real work without metrics rather than not at all."""
    host, port = parse_addr(address(settings, kind))
    try:
        server, _thread = start_http_server(port, host, registry)
    except OSError as exc:
        log.error("metrics endpoint of the %s not started on %s:%s: %s", kind, host, port, exc)
        return None
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{server.server_port}/metrics"
    target = url_file(settings, kind, os.getpid())
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = target.with_suffix(".tmp")
    partial.write_text(url + "\n")
    partial.replace(target)  # a reader never sees half a URL
    log.info("metrics of the %s at %s", kind, url)
    return url


def _remove_stale(root: Path) -> None:
    """Directories and URL files of processes that are gone (a killed worker's, say)."""
    for entry in root.glob("*-*"):
        pid = entry.name.rsplit("-", 1)[-1].removesuffix(".url")
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def multiprocess_dir(settings: Settings, kind: Kind, pid: int) -> Path:
    return Path(settings.metrics_dir) / f"{kind}-{pid}"


def start_multiprocess(settings: Settings, kind: Kind = "worker") -> CollectorRegistry:
    """In the main process, before it forks children (a worker's pool, the gateway's
    processes): a fresh directory that they write to, and the registry that sums it."""
    root = Path(settings.metrics_dir)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    _remove_stale(root)
    path = multiprocess_dir(settings, kind, os.getpid())
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    os.environ[_MULTIPROC_ENV] = str(path)
    # prometheus_client picks its value class at import; switch it now, before any
    # metric object exists (tasks.observe.metrics builds them on first use).
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    metrics.reset()
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(path))  # type: ignore[no-untyped-call]
    return registry


def child_exited(pid: int) -> None:
    if os.environ.get(_MULTIPROC_ENV):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def stop(kind: Kind, settings: Settings) -> None:
    url_file(settings, kind, os.getpid()).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        shutil.rmtree(multiprocess_dir(settings, kind, os.getpid()))
