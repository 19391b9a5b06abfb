"""Deleting local sandboxes: the whole process tree dies, whatever the play did to it."""

# ruff: noqa: F811 - test parameters named `provider` take the imported fixture
from __future__ import annotations

import random
import shutil

import pytest

from tasks.sandbox import LocalProvider, SandboxNotFoundError
from tasks.sandbox.local import processes
from tasks.sandbox.local.processes import is_live
from tests.support.local_sandbox import (  # noqa: F401 (provider: a fixture)
    TREE_MODES,
    find_pids,
    play_sandbox,
    provider,
    wait_exit,
    wait_for,
)


@pytest.mark.parametrize("provider", TREE_MODES, indirect=True)
def test_delete_kills_the_whole_tree(provider: LocalProvider) -> None:
    prov = provider
    tag = f"{random.randint(100, 999)}.{random.randint(10**8, 10**9)}"
    src = (
        "import subprocess, time\n"
        "def run(ctx, input):\n"
        f"    subprocess.Popen(['sleep', '1{tag}'])\n"
        f"    subprocess.Popen(['sleep', '2{tag}'], start_new_session=True)\n"
        f"    subprocess.Popen(['sh', '-c', 'sleep 3{tag} & exec sleep 4{tag}'])\n"
        "    open('ready', 'w').close()\n"
        "    time.sleep(1000)\n"
    )
    sid = play_sandbox(prov, src)
    prov.exec_detached(sid, ["{python}", "runner.py", "--timeout", "100"], env={}, timeout_s=100)
    wait_for(lambda: prov.read_file(sid, "ready", max_bytes=1) is not None)

    def all_four() -> set[int] | None:
        found = find_pids(tag)
        return found if len(found) == 4 else None

    pids: set[int] = wait_for(all_four)
    tops = prov._sandbox_processes(sid)
    assert tops
    prov.delete(sid)
    assert not any(is_live(pid) for pid in pids | tops)
    assert not find_pids(tag)
    assert not (prov.root / sid).exists()
    with pytest.raises(SandboxNotFoundError):
        prov.poll(sid)
    prov.delete(sid)  # idempotent



@pytest.mark.parametrize("provider", ["strict", "pidns"], indirect=True)
def test_a_play_that_returned_leaves_nothing_even_without_the_proc_scan(
    provider: LocalProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a normal exit the delete trusts the PID namespace (its init is gone, so the
    kernel killed every member) and skips the /proc scans; daemons the play left behind,
    in their own sessions, are dead all the same."""
    prov = provider
    tag = f"{random.randint(100, 999)}.{random.randint(10**8, 10**9)}"
    src = (
        "import subprocess\n"
        "def run(ctx, input):\n"
        f"    subprocess.Popen(['sleep', '7{tag}'], start_new_session=True)\n"
        f"    subprocess.Popen(['sh', '-c', 'trap \"\" TERM; sleep 8{tag}'],\n"
        "                     start_new_session=True)\n"
        "    return 'done'\n"
    )
    sid = play_sandbox(prov, src)
    prov.exec_detached(sid, ["{python}", "runner.py", "--timeout", "100"], env={}, timeout_s=100)
    assert wait_exit(prov, sid).exit_code == 0
    scans: list[str] = []
    monkeypatch.setattr(processes, "sandbox_processes",
                        lambda *a: scans.append("scan") or set())
    prov.delete(sid)
    assert scans == []  # the fast path was taken
    assert wait_for(lambda: not find_pids(tag), within=5)
    assert not (prov.root / sid).exists()



@pytest.mark.parametrize("provider", TREE_MODES, indirect=True)
def test_delete_kills_the_tree_of_a_play_that_deleted_its_own_directory(
    provider: LocalProvider,
) -> None:
    prov = provider
    tag = f"{random.randint(100, 999)}.{random.randint(10**8, 10**9)}"
    src = (
        "import os, shutil, subprocess, time\n"
        "def run(ctx, input):\n"
        f"    subprocess.Popen(['sleep', '5{tag}'], start_new_session=True)\n"
        "    shutil.rmtree(os.getcwd(), ignore_errors=True)\n"
        f"    subprocess.Popen(['sh', '-c', 'sleep 6{tag}'], start_new_session=True)\n"
        "    time.sleep(1000)\n"
    )
    sid = play_sandbox(prov, src)
    prov.exec_detached(sid, ["{python}", "runner.py", "--timeout", "100"], env={}, timeout_s=100)

    def both() -> set[int] | None:
        found = find_pids(tag)
        return found if len(found) >= 2 else None

    pids: set[int] = wait_for(both)
    sandbox = prov.root / sid
    # A strict play can only empty its directory (it is a mount point inside); whoever
    # removes it on the host, the outcome must be the same.
    wait_for(lambda: not sandbox.exists() or not any(sandbox.iterdir()))
    shutil.rmtree(sandbox, ignore_errors=True)
    assert not sandbox.exists()
    assert sid in [ref.sandbox_id for ref in prov.list({"playrun": "1"})]  # GC sees it
    assert prov.poll(sid).state == "running"
    prov.delete(sid)
    assert not any(is_live(pid) for pid in pids)
    assert not find_pids(tag)
    assert sid not in [ref.sandbox_id for ref in prov.list({})]
    assert not (prov.control_root / sid).exists()
    prov.delete(sid)  # idempotent



def test_delete_unknown_is_success(provider: LocalProvider) -> None:
    provider.delete("lsb-0123456789abcdef")
    provider.delete("../../etc")
    with pytest.raises(SandboxNotFoundError):
        provider.poll("lsb-0123456789abcdef")
