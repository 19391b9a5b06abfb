"""`import tasks` is free of side effects: it reads no setting, opens no connection, and
the public names resolve to what app code calls, whatever was imported before."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent("""
    import os, socket, sys
    opened = []
    real_connect = socket.socket.connect
    def connect(self, address):
        opened.append(address)
        return real_connect(self, address)
    socket.socket.connect = connect
    import tasks
    heavy = sorted(m for m in ("sqlalchemy", "redis", "psycopg", "models", "tasks.api",
                               "tasks.settings") if m in sys.modules)
    print("heavy", heavy)
    print("opened", opened)
    # Settings set after the import are the ones the app uses.
    os.environ["PLAYRUN_REDIS_URL"] = "redis://127.0.0.1:1/7"
    print("broker", tasks.app.conf.broker_url)
    print("submit", tasks.submit_run.__module__)
""")


def test_import_reads_nothing_and_settings_after_import_take_effect() -> None:
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("PLAYRUN_")}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=str(ROOT), env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "heavy []" in out, out
    assert "opened []" in out, out
    assert "broker redis://127.0.0.1:1/7" in out, out
    assert "submit tasks.api" in out, out


def test_no_subpackage_shadows_a_public_name() -> None:
    import tasks

    for info in pkgutil.walk_packages(tasks.__path__, "tasks."):
        if info.ispkg:
            importlib.import_module(info.name)
    for name in tasks.__all__:
        value = getattr(tasks, name)
        assert not isinstance(value, types.ModuleType), f"tasks.{name} is a module"
