"""Bare local sandbox spawn, strict (bubblewrap) against process isolation, side by side.

Each iteration: create, exec the no-op runner, poll to exit, read the result, delete;
modes alternate so drift on a shared machine hits both alike. No database or broker.

    python bench/bench_isolation.py [-n 40]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import pct  # noqa: E402

PLAY = ROOT / "examples" / "plays" / "noop.py"
OPS = ("create", "exec", "run to exit", "read result", "delete", "total")


def one(provider: object, files: dict[str, bytes]) -> dict[str, float]:
    from tasks.sandbox import LocalProvider, SandboxSpec

    assert isinstance(provider, LocalProvider)
    t0 = time.perf_counter()
    ref = provider.create(SandboxSpec(labels={"bench": "1"}, files=files))
    t1 = time.perf_counter()
    provider.exec_detached(ref.sandbox_id, ["{python}", "runner.py", "--timeout", "60"],
                           env={}, timeout_s=65)
    t2 = time.perf_counter()
    while provider.poll(ref.sandbox_id).state == "running":
        time.sleep(0.002)
    t3 = time.perf_counter()
    result = provider.read_file(ref.sandbox_id, "result.json", max_bytes=1 << 20)
    assert result is not None and json.loads(result.data)["status"] == "succeeded"
    t4 = time.perf_counter()
    provider.delete(ref.sandbox_id)
    t5 = time.perf_counter()
    return dict(zip(OPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=40)
    args = parser.parse_args()
    from tasks.acquisition.sandbox import runner_files
    from tasks.sandbox import LocalProvider
    from tasks.sandbox.local import probe_strict
    from tasks.settings import get_settings

    base = Path(tempfile.mkdtemp(prefix="bench-isolation-"))
    problem = probe_strict(get_settings(), base / "strict")
    if problem:
        sys.exit(f"strict isolation unavailable here: {problem}")
    providers = {
        "strict": LocalProvider(base / "strict", isolation="strict"),
        "process": LocalProvider(base / "process", isolation="process"),
    }
    files = {"play.py": PLAY.read_bytes(), "input.json": b"{}", **runner_files()}
    samples: dict[str, list[dict[str, float]]] = {mode: [] for mode in providers}
    for provider in providers.values():  # warm-up (probe, imports, page cache)
        one(provider, files)
    for _ in range(args.n):
        for mode, provider in providers.items():
            samples[mode].append(one(provider, files))

    print(f"bare local sandbox spawn, no-op runner, n={args.n} per mode (ms)")
    print(f"{'op':14} {'strict p50':>11} {'p99':>8} {'process p50':>12} {'p99':>8} "
          f"{'ratio p50':>10}")
    for op in OPS:
        strict = [s[op] * 1000 for s in samples["strict"]]
        process = [s[op] * 1000 for s in samples["process"]]
        ratio = pct(strict, 50) / pct(process, 50) if pct(process, 50) else float("nan")
        print(f"{op:14} {pct(strict, 50):11.1f} {pct(strict, 99):8.1f} "
              f"{pct(process, 50):12.1f} {pct(process, 99):8.1f} {ratio:9.2f}x")


if __name__ == "__main__":
    main()
