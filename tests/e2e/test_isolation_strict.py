"""Strict isolation (bubblewrap) against hostile plays, through a real worker.

Each hostile play is refused by the sandbox: its run ends with a clear code, or succeeds
having learned nothing; and the worker then serves the next run (checked after every test).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import tasks
from tasks.acquisition.sandbox import runner_files
from tasks.errors import ConfigurationError
from tasks.host.processes import free_port
from tasks.sandbox import LocalProvider, SandboxSpec, supervisor_proc
from tasks.sandbox.local import isolation as isolation_mod
from tasks.settings import Settings, get_settings
from tests.support.env import SANDBOX_ROOT
from tests.support.helpers import eventually, kinds
from tests.support.paths import HELLO, PLAYS, ROOT
from tests.support.runs import FAST_STARTS
from tests.support.session import BASE_ENV, TEST_PG_URL
from tests.support.stack import Gateway, Worker, worker_env

pytestmark = pytest.mark.slow
ESCAPE = PLAYS / "escape.py"
RUNNER = runner_files()
MAX_FILE_MB = 16
MAX_DIR_MB = 48
MAX_PROCESSES = 64


def _strict_available() -> str | None:
    return isolation_mod.probe_strict(get_settings(), SANDBOX_ROOT)


if _strict_available():
    pytest.skip(f"strict isolation unavailable here: {_strict_available()}",
                allow_module_level=True)


def org() -> str:
    return f"iso-{uuid.uuid4().hex[:8]}"


class Listener:
    """A TCP listener on loopback that counts who reaches it: a port no sandbox may reach."""

    def __init__(self) -> None:
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.tcp_port = self.tcp.getsockname()[1]
        self.tcp_hits = 0
        threading.Thread(target=self._serve_tcp, daemon=True).start()

    def _serve_tcp(self) -> None:
        while True:
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                return
            self.tcp_hits += 1
            conn.close()

    def close(self) -> None:
        self.tcp.close()


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    stand_in = Listener()
    yield stand_in
    stand_in.close()


@pytest.fixture(scope="module")
def gateway(pg_url: str) -> Iterator[Gateway]:
    """A gateway of the module's own: its socket is the one way out of a strict sandbox, and
    the runs settle through it as soon as they end."""
    directory = Path(tempfile.mkdtemp(prefix="playrun-gw-"))
    directory.chmod(0o755)
    g = Gateway(worker_env(PLAYRUN_GATEWAY_URL=f"http://127.0.0.1:{free_port()}",
                           PLAYRUN_GATEWAY_SOCKET=str(directory / "gateway.sock")))
    yield g
    g.stop()


@pytest.fixture(scope="module")
def strict_worker(gateway: Gateway) -> Iterator[Worker]:
    env = worker_env(
        PLAYRUN_SANDBOX_ISOLATION="strict",
        PLAYRUN_GATEWAY_URL=gateway.env["PLAYRUN_GATEWAY_URL"],
        PLAYRUN_GATEWAY_SOCKET=gateway.env["PLAYRUN_GATEWAY_SOCKET"],
        PLAYRUN_RUN_TIMEOUT_S="30",
        PLAYRUN_SANDBOX_MAX_FILE_MB=str(MAX_FILE_MB),
        PLAYRUN_SANDBOX_MAX_DIR_MB=str(MAX_DIR_MB),
        PLAYRUN_SANDBOX_MAX_PROCESSES=str(MAX_PROCESSES),
        **FAST_STARTS,
    )
    w = Worker(env)
    w.wait_ready()
    assert "sandbox isolation: strict" in w.output()
    yield w
    w.stop()


@pytest.fixture(autouse=True)
def _worker_serves_the_next_run(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "strict_worker" not in request.fixturenames:
        return
    w: Worker = request.getfixturevalue("strict_worker")
    assert w.proc.poll() is None, "the worker died"
    result = tasks.submit_run(HELLO, input={"name": "Ada"}, org_id=org()).wait(timeout=60)
    assert result.status == "succeeded", result


def probe(name: str, **args: Any) -> tasks.RunResult:
    return tasks.submit_run(ESCAPE, input={"probe": name, **args}, org_id=org()).wait(timeout=90)


def refused(value: str) -> bool:
    return value.startswith("refused")


def host_pids(marker: str) -> set[int]:
    return {
        int(e.name)
        for e in os.scandir("/proc")
        if e.name.isdigit() and any(marker in a for a in supervisor_proc.read_cmdline(int(e.name)))
    }


# --- through the worker -------------------------------------------------------------------


def test_files_outside_the_sandbox_are_out_of_reach(strict_worker: Worker,
                                                     tmp_path: Path) -> None:
    db = tmp_path / "playrun.db"
    sqlite3.connect(db).execute("create table t (x)").connection.close()
    venv_file = Path(sqlite3.__file__)  # any file of the worker's Python
    site_file = Path(tasks.__file__)  # the project, as installed in the venv
    read = [str(SANDBOX_ROOT), str(db), str(ROOT / "tasks" / "settings.py"),
            str(ROOT / "pyproject.toml"), str(site_file), str(Path.home() / ".bash_history"),
            "/etc/shadow", "/etc/hosts", str(ROOT / ".venv" / "pyvenv.cfg")]
    write = [str(SANDBOX_ROOT / "evil"), str(db), str(ROOT / "evil"), str(tmp_path / "evil"),
             "/usr/evil", "/etc/evil", "/evil", "/run/playrun/evil", "/dev/evil",
             str(venv_file.parent / "evil.py")]
    listed = [str(SANDBOX_ROOT), str(ROOT), str(tmp_path), "/home", "/run/playrun"]
    result = probe("files", read=read, write=write, list=listed)
    assert result.status == "succeeded", result
    out = result.output
    assert all(refused(v) for v in out["read"].values()), out["read"]
    assert all(refused(v) for v in out["write"].values()), out["write"]
    assert all(refused(out["list"][p]) for p in listed[:-2]), out["list"]
    assert out["list"]["/run/playrun"] == "ok: ['gateway.sock']"
    assert out["root"] == sorted(["bin", "dev", "etc", "lib", "lib64", "proc", "root", "run",
                                  "sandbox", "sbin", "tmp", "usr"]) or "root" not in out["root"]
    assert not (SANDBOX_ROOT / "evil").exists() and not (ROOT / "evil").exists()
    assert not (tmp_path / "evil").exists() and not (venv_file.parent / "evil.py").exists()
    assert sqlite3.connect(db).execute("select count(*) from t").fetchone() == (0,)


def test_proc_shows_no_secret_of_the_worker(strict_worker: Worker) -> None:
    result = probe("environ")
    assert result.status == "succeeded", result
    seen = json.dumps(result.output)
    for secret in (BASE_ENV["PLAYRUN_SECRET_KEY"], TEST_PG_URL, "PLAYRUN_DATABASE_URL",
                   "PLAYRUN_REDIS_URL", str(SANDBOX_ROOT)):
        assert secret not in seen
    # Its own PID namespace: bwrap's init and the runner's processes, none of the host's.
    assert result.output["pids"][0] == 1 and max(result.output["pids"]) < 50
    assert strict_worker.proc.pid not in result.output["pids"] or strict_worker.proc.pid < 50


def test_no_network_but_the_gateway_socket(strict_worker: Worker, gateway: Gateway,
                                           listener: Listener) -> None:
    gateway_port = urlsplit(gateway.env["PLAYRUN_GATEWAY_URL"]).port
    ports = [5432, 6379, listener.tcp_port, gateway_port]
    result = probe("network", ports=ports)
    assert result.status == "succeeded", result
    out = result.output
    assert out["interfaces"] == ["lo"]
    for port in ports:
        assert out[f"127.0.0.1:{port}"] == "refused: ECONNREFUSED", out
    assert refused(out["resolve"]) and listener.tcp_hits == 0
    assert out["route"] == "ok: []"
    answer = probe("gateway")
    assert answer.status == "succeeded", answer
    assert answer.output["answer"] == "HTTP/1.1 200 OK"  # the gateway's /healthz
    assert answer.output["unlink"] == "refused: EROFS"
    assert Path(gateway.env["PLAYRUN_GATEWAY_SOCKET"]).exists()


def test_mounts_clock_signals_and_ptrace_are_refused(strict_worker: Worker) -> None:
    before = time.time()
    result = probe("kernel", worker_pid=strict_worker.proc.pid)
    assert result.status == "succeeded", result
    out = result.output
    assert out["date -s"] != 0
    for what, value in out.items():
        if what != "date -s":
            assert refused(value), (what, value)
    assert out["kill the worker"] == "refused: ESRCH"  # not in its PID namespace
    # ptrace and the kernel's riskier interfaces are filtered out (seccomp) altogether.
    for call in ("ptrace the worker", "ptrace its own child", "io_uring_setup", "bpf",
                 "userfaultfd", "keyctl", "perf_event_open"):
        assert out[call] == "refused: EPERM", (call, out[call])
    assert abs(time.time() - before) < 120 and strict_worker.proc.poll() is None


def test_a_fork_bomb_is_bounded_and_cleaned_up(strict_worker: Worker) -> None:
    result = probe("forkbomb")
    assert result.status == "succeeded", result
    assert result.output["error"] == "EAGAIN"
    assert result.output["forked"] < MAX_PROCESSES
    # Nothing of it outlives the run (the PID namespace dies with the runner).
    eventually(lambda: not host_pids(str(ESCAPE.name)) or None, timeout=10,
               what="the fork bomb gone")


def test_eight_gigabytes_cannot_be_allocated(strict_worker: Worker) -> None:
    result = probe("memory")
    assert (result.status, result.code) == ("failed", "PLAY_ERROR")
    assert result.error and result.error.startswith("MemoryError")


def test_a_file_past_the_size_limit_fails_the_play(strict_worker: Worker) -> None:
    result = probe("big_file", mb=MAX_FILE_MB * 4)
    assert (result.status, result.code) == ("failed", "PLAY_ERROR")
    assert result.error and "File too large" in result.error


def test_filling_the_directory_past_its_cap_stops_the_run(strict_worker: Worker) -> None:
    handle = tasks.submit_run(ESCAPE, input={"probe": "many_files", "files": 500,
                                             "mb_each": 4}, org_id=org())
    result = handle.wait(timeout=90)
    # Stopped by the provider, so no result document: the run fails, never hangs.
    assert (result.status, result.code) == ("failed", "RUNTIME_RUNNER_LOST")
    assert "without a result" in (result.error or "")
    eventually(lambda: "sandbox.deleted" in kinds(handle.id), what="the sandbox deleted")


def test_a_daemon_left_behind_is_gone_after_the_run(strict_worker: Worker) -> None:
    tag = f"{random.randint(100, 999)}.{random.randint(10**8, 10**9)}"
    handle = tasks.submit_run(ESCAPE, input={"probe": "daemon", "tag": tag}, org_id=org())
    result = handle.wait(timeout=60)
    assert result.status == "succeeded", result
    eventually(lambda: "sandbox.deleted" in kinds(handle.id), what="the sandbox deleted")
    assert not host_pids(tag)


# --- the provider directly: two sandboxes side by side ------------------------------------


def _wait(prov: LocalProvider, sid: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while prov.poll(sid).state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _sandbox(prov: LocalProvider, source: bytes, input_data: Any) -> str:
    files = {**RUNNER, "play.py": source, "input.json": json.dumps(input_data).encode()}
    return prov.create(SandboxSpec(labels={"t": "iso"}, files=files)).sandbox_id


def test_a_sandbox_cannot_see_another_sandbox_or_its_token(tmp_path: Path) -> None:
    prov = LocalProvider(tmp_path / "sb", isolation="strict")
    token = "tok-" + secrets.token_hex(16)
    victim = _sandbox(prov, b"import time\ndef run(ctx, input):\n    time.sleep(60)\n", None)
    (prov.root / victim / "secret.txt").write_text(token)
    prov.exec_detached(victim, ["{python}", "runner.py", "--timeout", "60"],
                       env={"PLAYRUN_TOKEN": token}, timeout_s=60)
    victim_dir = str(prov.root / victim)
    try:
        for name, args in (
            ("files", {"read": [f"{victim_dir}/secret.txt", f"/proc/{prov.root}"],
                       "list": [str(prov.root), victim_dir, str(prov.control_root)],
                       "write": [f"{victim_dir}/play.py"]}),
            ("environ", {}),
        ):
            spy = _sandbox(prov, ESCAPE.read_bytes(), {"probe": name, **args})
            prov.exec_detached(spy, ["{python}", "runner.py", "--timeout", "20"],
                               env={"PLAYRUN_TOKEN": "spy-token"}, timeout_s=30)
            _wait(prov, spy)
            read = prov.read_file(spy, "result.json", max_bytes=1 << 22)
            assert read is not None
            result = json.loads(read.data)
            assert result["status"] == "succeeded", result
            assert token not in read.data.decode()
            if name == "files":
                out = result["output"]
                assert all(refused(v) for section in ("read", "list", "write")
                           for v in out[section].values()), out
            else:  # its own token is there (its own processes), the victim's is not
                assert "spy-token" in read.data.decode()
        assert prov.poll(victim).state == "running"
        assert (prov.root / victim / "play.py").read_bytes().startswith(b"import time")
    finally:
        for ref in prov.list({}):
            prov.delete(ref.sandbox_id)


def test_the_gateway_socket_env_points_inside_the_sandbox(tmp_path: Path) -> None:
    prov = LocalProvider(tmp_path / "sb", isolation="strict")
    # A plain process, not the runner: the runner takes its own settings out of the
    # environment before a play could read them.
    dump = (b"import getpass, json, os\n"
            b"env = dict(os.environ, USER_IS=getpass.getuser(), UID=str(os.getuid()))\n"
            b"open('result.json', 'w').write(json.dumps(env))\n")
    sid = prov.create(SandboxSpec(labels={"t": "iso"}, files={"dump.py": dump})).sandbox_id
    socket_path = tmp_path / "gw" / "gateway.sock"
    prov.exec_detached(sid, ["{python}", "dump.py"], env={
        "PLAYRUN_GATEWAY_SOCKET": str(socket_path),
        "PLAYRUN_GATEWAY_URL": "http://127.0.0.1:8765",
        "PLAYRUN_TOKEN": "t",
    }, timeout_s=30)
    _wait(prov, sid)
    read = prov.read_file(sid, "result.json", max_bytes=1 << 20)
    assert read is not None
    env = json.loads(read.data)
    assert env["PLAYRUN_GATEWAY_SOCKET"] == "/run/playrun/gateway.sock"
    assert env["PLAYRUN_GATEWAY_URL"] == "http://127.0.0.1:8765"
    assert env["HOME"] == "/sandbox"
    assert (env["USER_IS"], env["UID"]) == ("sandbox", "1000")
    # The play's files belong to the unprivileged host uid, and the worker still reads them.
    if os.geteuid() == 0:
        assert (prov.root / sid / "result.json").stat().st_uid == get_settings().sandbox_uid
    prov.delete(sid)
    assert not (prov.root / sid).exists()


# --- start-up: the mode and the refusal ---------------------------------------------------


def test_strict_refuses_to_start_where_bubblewrap_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setattr(isolation_mod, "_probes", {})
    monkeypatch.setattr(isolation_mod.shutil, "which", lambda name, *a, **k: None)
    strict = Settings(sandbox_isolation="strict", sandbox_root=tmp_path)
    with pytest.raises(ConfigurationError, match="bubblewrap is not installed"):
        isolation_mod.check_isolation(strict)
    auto = Settings(sandbox_isolation="auto", sandbox_root=tmp_path)
    assert isolation_mod.check_isolation(auto) == "process"
    assert isolation_mod.check_isolation(Settings(sandbox_isolation="process")) == "process"


def test_a_worker_configured_strict_without_bubblewrap_does_not_start(pg_url: str,
                                                                       tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    w = Worker(worker_env(PLAYRUN_SANDBOX_ISOLATION="strict", PATH=str(empty)))
    try:
        assert w.proc.wait(timeout=60) != 0
        assert "bubblewrap is not installed" in w.output()
    finally:
        w.stop()
