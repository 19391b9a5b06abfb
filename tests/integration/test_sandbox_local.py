"""The local provider with real processes: isolation, limits, polling and teardown."""

# ruff: noqa: F811 - test parameters named `provider` take the imported fixture
from __future__ import annotations

import json
import multiprocessing
import os
import random
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tasks.errors import ConfigurationError
from tasks.sandbox import (
    LocalProvider,
    ProcessStatus,
    ProviderError,
    SandboxNotFoundError,
    SandboxSpec,
    get_provider,
    supervisor_limits,
    supervisor_proc,
)
from tasks.sandbox.local import limits as limits_mod
from tasks.sandbox.local.processes import is_live
from tasks.sandbox.local.records import read_json
from tests.support.local_sandbox import (  # noqa: F401 (provider: a fixture)
    RUNNER,
    TREE_MODES,
    find_pids,
    is_strict,
    play_sandbox,
    provider,
    run_play,
    wait_exit,
    wait_for,
)


def test_create_exec_poll_exit_code(provider: LocalProvider) -> None:
    ref = provider.create(SandboxSpec(labels={"playrun": "1", "k": "v"}, files={"a/b.txt": b"x"}))
    assert ref.provider == "local" and ref.sandbox_id.startswith("lsb-")
    sandbox = provider.root / ref.sandbox_id
    assert (sandbox.stat().st_mode & 0o777) == 0o700
    assert (sandbox / "a" / "b.txt").read_bytes() == b"x"
    code = "import sys, time; time.sleep(0.3); sys.exit(7)"
    provider.exec_detached(ref.sandbox_id, ["{python}", "-c", code], env={}, timeout_s=10)
    assert provider.poll(ref.sandbox_id).state == "running"
    assert wait_exit(provider, ref.sandbox_id) == ProcessStatus("exited", 7, False)
    with pytest.raises(ProviderError):
        provider.exec_detached(ref.sandbox_id, ["true"], env={}, timeout_s=1)


def test_runner_through_provider(provider: LocalProvider) -> None:
    src = "def run(ctx, input):\n    ctx.log('hi', n=input['n'])\n    return input['n'] * 2\n"
    sid, status, result = run_play(provider, src, {"n": 21}, env={"PLAYRUN_RUN_ID": "r-9"})
    assert status == ProcessStatus("exited", 0, False)
    assert result == {"status": "succeeded", "output": 42}
    events = provider.read_file(sid, "events.jsonl", max_bytes=10000)
    assert events is not None and json.loads(events.data)["fields"] == {"n": 21}


def test_environment_is_scrubbed(provider: LocalProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAYRUN_DATABASE_URL", "postgresql://user:pw@db/playrun")
    monkeypatch.setenv("SECRET", "hunter2")
    monkeypatch.setenv("PYTHONPATH", "/nowhere")
    src = (
        "import os, sys\n"
        "def run(ctx, input):\n"
        "    return {'env': dict(os.environ), 'cwd': os.getcwd(), 'prefix': sys.prefix,\n"
        "            'flags': [sys.flags.ignore_environment, sys.flags.no_user_site]}\n"
    )
    sid, _, result = run_play(provider, src, env={"PLAYRUN_RUN_ID": "r-1"})
    out = result["output"]
    sandbox = "/sandbox" if is_strict(provider) else str(provider.root / sid)
    if is_strict(provider):
        assert out["env"].pop("PWD") == sandbox  # set by bwrap's --chdir
    assert out["env"] == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": sandbox,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PLAYRUN_RUN_ID": "r-1",
    }
    assert out["cwd"] == sandbox
    if is_strict(provider):  # the base interpreter: the venv is not in the sandbox
        assert out["prefix"] == sys.base_prefix
    else:
        assert out["prefix"] == sys.prefix  # -s -E keep the venv usable
    assert out["flags"] == [1, 1]


def test_the_exec_env_and_its_token_are_never_written_to_disk(provider: LocalProvider) -> None:
    token = "tok-" + secrets.token_hex(16)
    sid = play_sandbox(provider, "import time\ndef run(ctx, input):\n    time.sleep(1000)\n")
    provider.exec_detached(sid, ["{python}", "runner.py", "--timeout", "100"],
                           env={"PLAYRUN_TOKEN": token}, timeout_s=100)
    wait_for(lambda: (provider.control_root / sid / supervisor_proc.NS_FILE).exists()
             or not is_strict(provider))
    for base in (provider.root, provider.control_root):
        for path in base.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert token.encode() not in path.read_bytes(), path
    assert all(
        (p.stat().st_mode & 0o077) == 0 for p in (provider.control_root / sid).iterdir()
    )


def test_list_by_labels(provider: LocalProvider) -> None:
    a = provider.create(
        SandboxSpec(labels={"playrun": "1", "playrun.run": "a", "o": "x"}, files={})
    )
    b = provider.create(
        SandboxSpec(labels={"playrun": "1", "playrun.run": "b", "o": "x"}, files={})
    )
    provider.create(SandboxSpec(labels={"other": "1"}, files={}))
    assert [r.sandbox_id for r in provider.list({"playrun": "1"})] == [a.sandbox_id, b.sandbox_id]
    assert provider.list({"playrun.run": "b"}) == [b]
    assert provider.list({"o": "x", "playrun.run": "a"}) == [a]
    assert provider.list({"o": "y"}) == []
    assert len(provider.list({})) == 3
    assert LocalProvider(provider.root / "nope").list({}) == []


def _poll_and_delete(root: str, sandbox_id: str, conn: Any) -> None:
    prov = LocalProvider(Path(root))
    conn.send(prov.poll(sandbox_id).state)
    prov.delete(sandbox_id)
    conn.send("deleted")


def test_another_process_can_poll_and_delete(provider: LocalProvider) -> None:
    sid = play_sandbox(provider, "import time\ndef run(ctx, input):\n    time.sleep(1000)\n")
    provider.exec_detached(
        sid, ["{python}", "runner.py", "--timeout", "100"], env={}, timeout_s=100
    )
    tops = provider._sandbox_processes(sid)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_poll_and_delete, args=(str(provider.root), sid, child))
    proc.start()
    assert parent.recv() == "running"
    assert parent.recv() == "deleted"
    proc.join(10)
    assert proc.exitcode == 0
    assert not (provider.root / sid).exists()
    assert not any(is_live(pid) for pid in tops)


@pytest.mark.parametrize("provider", TREE_MODES, indirect=True)
def test_wall_clock_timeout_kills_a_play_ignoring_sigalrm(provider: LocalProvider) -> None:
    sid = provider.create(SandboxSpec(labels={}, files={})).sandbox_id
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.1)\n"
        "time.sleep(1000)\n"
    )
    start = time.monotonic()
    provider.exec_detached(sid, ["{python}", "-c", code], env={}, timeout_s=1)
    status = wait_exit(provider, sid)
    assert status == ProcessStatus("exited", -signal.SIGKILL, True)
    assert 0.9 < time.monotonic() - start < 5


@pytest.mark.parametrize("provider", TREE_MODES, indirect=True)
def test_a_sandbox_never_execed_says_so_unlike_a_lost_process(provider: LocalProvider) -> None:
    sid = provider.create(SandboxSpec(labels={}, files={})).sandbox_id
    assert provider.poll(sid).state == "never_started"
    provider.exec_detached(sid, [sys.executable, "-c", "pass"], env={}, timeout_s=30)
    assert wait_exit(provider, sid).state == "exited"


def test_missing_when_supervisor_is_killed(provider: LocalProvider) -> None:
    sid = provider.create(SandboxSpec(labels={}, files={})).sandbox_id
    tag = f"{random.randint(100, 999)}.{random.randint(10**8, 10**9)}"
    provider.exec_detached(sid, ["sleep", tag], env={}, timeout_s=100)
    pids = wait_for(lambda: find_pids(tag))
    record = json.loads((provider.control_root / sid / "proc.json").read_text())
    os.killpg(record["pid"], signal.SIGKILL)  # not the play's own session
    assert wait_for(lambda: provider.poll(sid).state == "missing")
    # The orphaned play is still found (by its sandbox HOME) and killed.
    provider.delete(sid)
    assert not any(is_live(pid) for pid in pids)


def test_delete_waits_for_bwrap_outside_the_namespace(provider: LocalProvider) -> None:
    if not is_strict(provider):
        pytest.skip("bwrap runs in strict isolation only")
    sid = provider.create(SandboxSpec(labels={}, files={})).sandbox_id
    tag = f"{random.randint(100, 999)}.{random.randint(10**8, 10**9)}"
    provider.exec_detached(sid, ["sleep", tag], env={}, timeout_s=100)
    wait_for(lambda: find_pids(tag))
    ns = wait_for(lambda: read_json(provider.control_root / sid / supervisor_proc.NS_FILE))
    # bwrap slow to notice its init's death (a busy host): it outlives the namespace.
    os.kill(ns["bwrap_pid"], signal.SIGSTOP)
    record = json.loads((provider.control_root / sid / "proc.json").read_text())
    os.killpg(record["pid"], signal.SIGKILL)
    assert wait_for(lambda: provider.poll(sid).state == "missing")
    provider.delete(sid)
    assert not is_live(ns["bwrap_pid"])


def test_memory_limit_makes_huge_allocation_fail(provider: LocalProvider) -> None:
    src = "def run(ctx, input):\n    return len(bytearray(2 * 1024 ** 3))\n"
    _, _, result = run_play(provider, src, memory_mb=256)
    assert result["status"] == "failed" and result["code"] == "PLAY_ERROR"
    assert result["error"].startswith("MemoryError")


def test_file_size_limit(provider: LocalProvider) -> None:
    src = "def run(ctx, input):\n    open('big', 'wb').write(b'x' * (3 * 1024 * 1024))\n"
    _, _, result = run_play(provider, src, max_file_mb=1)
    assert result["code"] == "PLAY_ERROR" and "File too large" in result["error"]


def test_console_output_is_bounded(provider: LocalProvider) -> None:
    src = "import os\ndef run(ctx, input):\n    os.write(1, b'z' * (3 * 1024 * 1024))\n"
    sid, _, result = run_play(provider, src)
    assert result["status"] == "succeeded"
    console = provider.read_file(sid, ".playrun/console.log", max_bytes=4 << 20)
    assert console is not None and console.size < 1024 * 1024 + 200
    assert b"bytes dropped" in console.data


def test_read_file_bounds_and_offsets(provider: LocalProvider) -> None:
    sid = provider.create(SandboxSpec(labels={}, files={"d/f.txt": b"0123456789"})).sandbox_id
    assert provider.read_file(sid, "d/f.txt", max_bytes=100) == _read(b"0123456789", 10, False)
    assert provider.read_file(sid, "d/f.txt", max_bytes=4) == _read(b"0123", 10, True)
    assert provider.read_file(sid, "./d/f.txt", offset=6, max_bytes=4) == _read(b"6789", 10, False)
    assert provider.read_file(sid, "d/f.txt", offset=20, max_bytes=4) == _read(b"", 10, False)
    assert provider.read_file(sid, "absent", max_bytes=4) is None
    assert provider.read_file(sid, "d/f.txt/x", max_bytes=4) is None
    with pytest.raises(SandboxNotFoundError):
        provider.read_file("lsb-0123456789abcdef", "x", max_bytes=1)


def _read(data: bytes, size: int, truncated: bool) -> Any:
    from tasks.sandbox import FileRead

    return FileRead(data, size, truncated)


@pytest.mark.parametrize("path", ["../x", "d/../../x", "/etc/hostname", "", "link", "dlink/f"])
def test_read_file_refuses_escapes(provider: LocalProvider, path: str) -> None:
    sid = provider.create(SandboxSpec(labels={}, files={"d/f": b"x"})).sandbox_id
    (provider.root / sid / "link").symlink_to("/etc/hostname")
    (provider.root / sid / "dlink").symlink_to(provider.root / sid / "d")
    with pytest.raises(ProviderError):
        provider.read_file(sid, path, max_bytes=100)


def test_create_refuses_escaping_files(provider: LocalProvider) -> None:
    for name in ("../evil", "/tmp/evil", ".playrun/meta.json"):
        with pytest.raises(ProviderError):
            provider.create(SandboxSpec(labels={}, files={name: b"x"}))
    assert provider.list({}) == []
    assert [p.name for p in provider.root.iterdir() if p.name != ".control"] == []
    assert not provider.control_root.exists() or not any(provider.control_root.iterdir())


def test_get_provider() -> None:
    assert get_provider("local", Path("/tmp/x")).name == "local"
    assert get_provider("fake", Path("/tmp/x")).name == "fake"
    with pytest.raises(ConfigurationError):
        get_provider("daytona-typo", Path("/tmp/x"))


def test_cgroup_v2_limits_are_probed_and_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a stand-in cgroup v2 tree: the probe enables the controllers, the supervisor's
    helpers write the limits and move the namespace's init in (this machine has no v2)."""
    from tasks.settings import Settings

    fake = tmp_path / "cgroup"
    fake.mkdir()
    (fake / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (fake / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(limits_mod, "CGROUP_ROOT", fake)
    monkeypatch.setattr(limits_mod, "_cgroups", {})
    delegated = fake / "delegated"
    delegated.mkdir()
    (delegated / "cgroup.controllers").write_text("cpu memory\n")
    (delegated / "cgroup.subtree_control").write_text("")
    base, said = limits_mod.cgroup_base(Settings(sandbox_cgroup=delegated))
    assert base is None and "['pids'] not available" in said
    (delegated / "cgroup.controllers").write_text("cpu memory pids\n")
    monkeypatch.setattr(limits_mod, "_cgroups", {})
    base, said = limits_mod.cgroup_base(Settings(sandbox_cgroup=delegated))
    assert base == delegated and "pids.max" in said
    assert (delegated / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    limits = limits_mod.cgroup_limits(256, 32, 0.5)
    assert limits == {"memory.max": str(256 << 20), "memory.swap.max": "0",
                      "pids.max": "32", "cpu.max": "50000 100000"}
    applied = supervisor_limits.cgroup_enter(base / "lsb-0123456789abcdef", limits, 4242)
    assert applied == list(limits)
    assert (base / "lsb-0123456789abcdef" / "cgroup.procs").read_text() == "4242"
    assert (base / "lsb-0123456789abcdef" / "pids.max").read_text() == "32"
    # Not root and nothing delegated: not applied, and said so.
    monkeypatch.setattr(limits_mod, "_cgroups", {})
    monkeypatch.setattr(limits_mod.os, "geteuid", lambda: 1000)
    assert limits_mod.cgroup_base(Settings())[0] is None


def test_the_gateway_socket_env_is_rewritten_only_in_strict_mode(
    provider: LocalProvider, tmp_path: Path
) -> None:
    host_socket = str(tmp_path / "gw" / "gateway.sock")
    sid = play_sandbox(provider, "")
    # The command's own view (the runner takes the variable out of the play's sight).
    show = "import os; open('seen', 'w').write(os.environ['PLAYRUN_GATEWAY_SOCKET'])"
    provider.exec_detached(sid, ["{python}", "-c", show],
                           env={"PLAYRUN_GATEWAY_SOCKET": host_socket}, timeout_s=20)
    assert wait_exit(provider, sid).exit_code == 0
    read = provider.read_file(sid, "seen", max_bytes=1000)
    expected = "/run/playrun/gateway.sock" if is_strict(provider) else host_socket
    assert read is not None and read.data.decode() == expected


def test_a_play_runs_at_the_configured_niceness_and_cannot_undo_it(
        provider: LocalProvider) -> None:
    """The host's gateway and workers come before a play on the CPU (PLAYRUN_SANDBOX_NICE)."""
    src = ("import os\ndef run(ctx, input):\n    before = os.getpriority(os.PRIO_PROCESS, 0)\n"
           "    try:\n        os.setpriority(os.PRIO_PROCESS, 0, 0)\n    except OSError:\n"
           "        pass\n    return [before, os.getpriority(os.PRIO_PROCESS, 0)]\n")
    _, _, result = run_play(provider, src)
    assert result["status"] == "succeeded", result
    before, after = result["output"]
    assert before == provider.settings.sandbox_nice == 10
    if os.geteuid() != 0 or is_strict(provider):  # root outside strict mode may renice itself
        assert after == 10


def test_a_strict_play_gets_a_cpu_cgroup_of_its_own_on_cgroup_v1(
        provider: LocalProvider) -> None:
    """Where only a cgroup v1 `cpu` hierarchy is writable: each sandbox has its own group
    (its share and quota) under one group for all sandboxes, removed when the play ends."""
    base = limits_mod.cgroup_base(provider.settings)[0]
    if not is_strict(provider) or base is None or not limits_mod.is_v1(base):
        pytest.skip("needs strict isolation and a writable cgroup v1 cpu hierarchy")
    src = ("def run(ctx, input):\n    import pathlib\n"
           "    return pathlib.Path('/proc/self/cgroup').read_text()\n")
    sid, _, result = run_play(provider, src)
    assert result["status"] == "succeeded", result
    assert f":cpu:/{base.name}/{sid}\n" in result["output"]
    assert wait_for(lambda: not (base / sid).exists())
    assert limits_mod.cgroup_limits(1024, 64, 0.5, base) == {
        "cpu.shares": "1024", "cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "50000"}
