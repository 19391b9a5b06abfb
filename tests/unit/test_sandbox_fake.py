"""The fake provider: scripted faults consumed atomically by several real processes."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from tasks.acquisition.sandbox import runner_files
from tasks.sandbox import (
    CapacityUnavailableError,
    FakeProvider,
    FakeScript,
    ProviderAuthError,
    ProviderError,
    RateLimitedError,
    SandboxSpec,
    TransportError,
    get_provider,
)

RUNNER = runner_files()
SPEC = SandboxSpec(labels={"playrun": "1"}, files={})


def wait_exit(prov: FakeProvider, sandbox_id: str, within: float = 15.0) -> Any:
    deadline = time.monotonic() + within
    while (status := prov.poll(sandbox_id)).state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return status


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("capacity_unavailable", CapacityUnavailableError),
        ("rate_limited", RateLimitedError),
        ("transport", TransportError),
        ("auth", ProviderAuthError),
        ("other", ProviderError),
    ],
)
def test_scripted_errors_raise_the_matching_class(
    tmp_path: Path, kind: str, cls: type[ProviderError]
) -> None:
    prov = get_provider("fake", tmp_path)
    assert isinstance(prov, FakeProvider)
    prov.script.set(fail_creates=[kind, kind])
    for _ in range(2):
        with pytest.raises(cls) as info:
            prov.create(SPEC)
        assert type(info.value) is cls and info.value.kind == kind
    ref = prov.create(SPEC)  # queue consumed: the next create succeeds
    assert ref.provider == "fake" and prov.list({"playrun": "1"}) == [ref]
    state = FakeScript(tmp_path).state()
    assert state["creates_ok"] == 1 and state["creates_rejected"] == {kind: 2}
    assert state["fail_creates"] == [] and len(state["create_times"]) == 1


def test_unknown_fault_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown fault kinds"):
        FakeScript(tmp_path).set(fail_creates=["capacity"])


def test_latency(tmp_path: Path) -> None:
    prov = FakeProvider(tmp_path)
    prov.script.set(latency_ms=200)
    start = time.monotonic()
    prov.create(SPEC)
    assert time.monotonic() - start >= 0.2


def _create_many(root: str, count: int, barrier: Any, out: Any) -> None:
    prov = FakeProvider(Path(root))
    barrier.wait()
    outcomes = []
    for _ in range(count):
        try:
            prov.create(SPEC)
            outcomes.append("ok")
        except ProviderError as exc:
            outcomes.append(f"{exc.kind}:{exc.message}")
    out.put(outcomes)


def _burst(root: Path, procs: int, each: int) -> list[str]:
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    workers = [
        ctx.Process(target=_create_many, args=(str(root), each, barrier, out)) for _ in range(procs)
    ]
    for w in workers:
        w.start()
    outcomes = [o for _ in workers for o in out.get(timeout=30)]
    for w in workers:
        w.join(10)
        assert w.exitcode == 0
    return outcomes


def test_max_creates_per_s_rejects_the_excess_across_processes(tmp_path: Path) -> None:
    script = FakeScript(tmp_path)
    script.set(max_creates_per_s=5)
    outcomes = _burst(tmp_path, procs=4, each=6)
    state = script.state()
    ok = outcomes.count("ok")
    assert len(outcomes) == 24
    assert ok == state["creates_ok"] == len(state["create_times"])
    assert state["creates_rejected"] == {"capacity_unavailable": 24 - ok}
    assert set(outcomes) == {"ok", "capacity_unavailable:no capacity"}
    times = sorted(state["create_times"])
    # A true capacity: no sliding 1 s window ever holds more than the rate.
    assert all(sum(1 for u in times if t <= u < t + 1.0) <= 5 for t in times)
    assert ok >= 5
    assert len(FakeProvider(tmp_path).list({})) == ok
    # Recovery: once the window has passed, creates succeed again.
    time.sleep(max(0.0, times[-1] + 1.0 - time.time()) + 0.05)
    FakeProvider(tmp_path).create(SPEC)


def test_fault_queue_is_consumed_exactly_once_across_processes(tmp_path: Path) -> None:
    FakeScript(tmp_path).set(fail_creates=["transport"] * 7)
    outcomes = _burst(tmp_path, procs=4, each=5)
    assert outcomes.count("ok") == 13
    assert outcomes.count("transport:scripted transport fault") == 7
    assert FakeScript(tmp_path).state()["creates_ok"] == 13


def test_lose_runner(tmp_path: Path) -> None:
    prov = FakeProvider(tmp_path)
    prov.script.set(lose_runner=1)
    files = {
        **RUNNER,
        "play.py": b"def run(ctx, input):\n    return 'ok'\n",
        "input.json": b"{}",
    }
    argv = ["{python}", "runner.py", "--timeout", "10"]
    lost = prov.create(SandboxSpec(labels={}, files=files)).sandbox_id
    prov.exec_detached(lost, argv, env={}, timeout_s=20)
    assert prov.poll(lost).state == "missing"
    assert prov.read_file(lost, "result.json", max_bytes=1000) is None
    assert prov.script.state()["runners_lost"] == 1

    fine = prov.create(SandboxSpec(labels={}, files=files)).sandbox_id
    prov.exec_detached(fine, argv, env={}, timeout_s=20)
    assert wait_exit(prov, fine).exit_code == 0
    read = prov.read_file(fine, "result.json", max_bytes=1000)
    assert read is not None and json.loads(read.data) == {"status": "succeeded", "output": "ok"}
    for sid in (lost, fine):
        prov.delete(sid)
    assert prov.list({}) == []


def test_reset_clears_counters(tmp_path: Path) -> None:
    script = FakeScript(tmp_path)
    script.set(fail_creates=["auth"])
    with pytest.raises(ProviderAuthError):
        FakeProvider(tmp_path).create(SPEC)
    script.reset()
    state = script.state()
    assert state["creates_rejected"] == {} and state["fail_creates"] == []
