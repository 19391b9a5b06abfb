"""The test session's settings that need no server: private directories, a fresh secret,
short intervals. conftest puts them in the environment at import; `session` adds the
PostgreSQL and Redis URLs when a test that needs them is collected."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

from tasks.host.processes import free_port

SANDBOX_ROOT = Path(tempfile.mkdtemp(prefix="playrun-test-sb-"))
GATEWAY_DIR = Path(tempfile.mkdtemp(prefix="playrun-test-gw-"))
METRICS_DIR = Path(tempfile.mkdtemp(prefix="playrun-test-metrics-"))
GATEWAY_PORT = free_port()

LOCAL_ENV = {
    "PLAYRUN_SECRET_KEY": "test-secret-" + secrets.token_hex(16),
    "PLAYRUN_SANDBOX_ROOT": str(SANDBOX_ROOT),
    "PLAYRUN_LEASE_SECONDS": "20",
    "PLAYRUN_RUN_TIMEOUT_S": "60",
    "PLAYRUN_GC_GRACE_S": "0",
    "PLAYRUN_GATEWAY_URL": f"http://127.0.0.1:{GATEWAY_PORT}",
    "PLAYRUN_GATEWAY_SOCKET": str(GATEWAY_DIR / "sock" / "gateway.sock"),
    # One gateway process unless a test asks for more.
    "PLAYRUN_GATEWAY_WORKERS": "1",
    "PLAYRUN_HEARTBEAT_INTERVAL_S": "1",
    "PLAYRUN_HEARTBEAT_TIMEOUT_S": "4",
    "PLAYRUN_REAP_INTERVAL_S": "1",
    # Tests kill release paths on purpose and wait for the reaper to take them over.
    "PLAYRUN_RELEASE_GRACE_S": "2",
    # Metrics endpoints on free ports (URLs in METRICS_DIR): never the defaults other
    # sessions or a real deployment on this machine listen on.
    "PLAYRUN_METRICS_DIR": str(METRICS_DIR),
    "PLAYRUN_METRICS_WORKER_ADDR": "127.0.0.1:0",
    "PLAYRUN_METRICS_BEAT_ADDR": "127.0.0.1:0",
    "PLAYRUN_METRICS_GATEWAY_ADDR": "127.0.0.1:0",
}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any PLAYRUN_ setting (a stack that configures itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYRUN_")}
    env.update(extra)
    return env
