"""Placement across providers, against loopback doubles (the real SDKs in real workers, a
`playrun gateway`, PostgreSQL, Redis; tests/doubles):

    python bench/bench_placement.py [--quick] [--only overhead|failover|goodput]
                                    [-n 15] [--rounds 3] [--failovers 30] [--rate 60]
                                    [--duration 120] [--warmup 60] [--backlog 30]

(i) Start overhead: submit -> runner started on the daytona double, by a worker serving
    daytona and local with a policy (daytona, fallback local), beside a worker serving
    daytona alone and no policy. The two take turns by batches (a fresh worker each, its
    first 2 runs warming the SDK clients), runs one at a time, spaced past the start-rate
    bucket's interval. Goal <= 1.05x.
(ii) Time to fail over: the daytona double refuses every create (capacity_unavailable).
    From the primary's `sandbox.requested` to the fallback's `placement.chosen` and to
    local's `sandbox.requested` (ledger rows, database clock), p50/p99, beside the bare SDK
    create the same double refuses (what the provider's "no" costs alone), taking turns.
(iii) Goodput: the daytona and e2b doubles each accept R creates a minute (sliding
    window, 429 past it); a policy sends half the runs to each (a 50% canary), beside
    daytona alone at R. A closed loop keeps --backlog runs outstanding; the creates the
    doubles accepted a minute after --warmup s. Both are told the limit
    (PLAYRUN_START_RATE_MAX_PER_MIN=R). Goal >= 1.6 R.
--quick: -n 6, 2 rounds, 10 failovers, goodput 60 s after a 30 s warm-up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.bench_providers import _still_running, reset_bucket  # noqa: E402
from bench.common import (  # noqa: E402
    bench_env,
    gateway_env,
    pct,
    start_gateway,
    start_worker,
    stop_on_sigterm,
)

PLAY = ROOT / "bench" / "plays" / "started_at.py"
NOOP = ROOT / "examples" / "plays" / "noop.py"
PRIMARY, FALLBACK, SECOND = "daytona", "local", "e2b"
WARM = 2  # runs of each batch that warm a fresh worker's SDK clients


def doubles() -> dict[str, Any]:
    from tests.doubles.base import discover

    return discover()


def serve(providers: list[str]) -> None:
    """This process's settings as the workers' (the fair relay's window is computed from
    the providers' rates by whoever submits)."""
    from tasks.settings import reset_settings

    os.environ.pop("PLAYRUN_PROVIDERS", None)
    if len(providers) > 1:
        os.environ["PLAYRUN_PROVIDERS"] = ",".join(providers)
    os.environ["PLAYRUN_SANDBOX_PROVIDER"] = providers[0]
    reset_settings()


@contextmanager
def worker(env: dict[str, str], running: list[Any], providers: list[str], log_dir: Path,
           name: str, concurrency: int = 2, **extra: str) -> Iterator[Any]:
    """A worker serving `providers` (several: PLAYRUN_PROVIDERS) on these doubles."""
    serve(providers)
    wenv = {**os.environ, **env, **extra,
            "PLAYRUN_SANDBOX_ROOT": str(log_dir / f"root-{name}")}
    for double in running:
        wenv.update(double.env)
    w = start_worker(wenv, log_dir, name, concurrency=concurrency, beat=True)
    try:
        yield w
    finally:
        w.stop()


def policy(name: str, provider: str, **kw: str) -> str:
    from tasks.admission import placement

    placement.set_policy(placement.build(name, provider, **kw), check_served=False)
    return name


def events(run_id: str) -> list[tuple[str, dict[str, Any], float]]:
    import tasks

    return [(e.kind, dict(e.data), e.at.timestamp()) for e in tasks.run_events(run_id)]


# (i) ---------------------------------------------------------------------------------

STAGES = ("submit -> attempt started", "attempt started -> sandbox requested",
          "sandbox requested -> sandbox live", "sandbox live -> runner started")


def one_start(i: int, placement: str | None) -> tuple[float, list[float]]:
    """Seconds from submit to the runner's start record, and the stages between."""
    import tasks

    t0 = time.time()
    handle = tasks.submit_run(PLAY, input={"i": i}, org_id="bench", placement=placement)
    result = handle.wait(timeout=120)
    assert result.status == "succeeded", result
    marks = events(handle.id)
    where = [d["provider"] for k, d, _ in marks if k == "sandbox.live"]
    assert where == [PRIMARY], where
    started = float(result.output["started_at"])
    first = {k: at for k, _d, at in reversed(marks)}
    points = [t0, *(first[k] for k in ("attempt.started", "sandbox.requested",
                                       "sandbox.live")), started]
    return started - t0, [b - a for a, b in zip(points, points[1:], strict=False)]


def overhead(env: dict[str, str], log_dir: Path, n: int, rounds: int,
             spacing: float) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"single": [], "placed": []}
    for kind in ("single", "placed"):
        for k in range(len(STAGES)):
            out[f"{kind}:{k}"] = []
    per_batch = max(1, -(-n // rounds))
    with doubles()[PRIMARY](log_dir / "double-overhead") as double:
        name = policy("bench-primary", PRIMARY, fallback=FALLBACK)
        for r in range(rounds):
            for kind in (("single", "placed") if r % 2 == 0 else ("placed", "single")):
                providers = [PRIMARY] if kind == "single" else [PRIMARY, FALLBACK]
                with worker(env, [double], providers, log_dir, f"overhead-{kind}-{r}"):
                    for i in range(WARM + per_batch):
                        t0 = time.time()
                        took, stages = one_start(i, name if kind == "placed" else None)
                        if i >= WARM:
                            out[kind].append(took)
                            for k, part in enumerate(stages):
                                out[f"{kind}:{k}"].append(part)
                        time.sleep(max(0.0, spacing - (time.time() - t0)))
            print(f"  round {r + 1}/{rounds}: single p50 {pct(out['single'], 50) * 1000:.0f} ms,"
                  f" placed p50 {pct(out['placed'], 50) * 1000:.0f} ms", flush=True)
    return out


# (ii) --------------------------------------------------------------------------------

def bare_refusal(double: Any, adapter: Any) -> float:
    from tasks.sandbox import ProviderError, SandboxSpec

    double.push_back("capacity_unavailable")
    t0 = time.time()
    try:
        adapter.create(SandboxSpec(labels={}, files={"x": b""}, key=f"b-{uuid.uuid4().hex}"))
    except ProviderError as exc:
        assert exc.kind == "capacity_unavailable", exc
        return time.time() - t0
    raise AssertionError("the double did not refuse")


def failover_marks(run_id: str) -> tuple[float, float, float]:
    """Seconds from the primary's create request to the fallback chosen, to the fallback's
    create request, and to its sandbox live."""
    marks = events(run_id)
    asked = next(at for k, d, at in marks if k == "sandbox.requested" and d["provider"] == PRIMARY)
    chosen = next(at for k, d, at in marks if k == "placement.chosen" and at >= asked
                  and d["reason"].startswith("fallback"))
    again = next(at for k, d, at in marks if k == "sandbox.requested" and at >= asked
                 and d["provider"] == FALLBACK)
    live = next(at for k, d, at in marks if k == "sandbox.live")
    return chosen - asked, again - asked, live - asked


def failover(env: dict[str, str], log_dir: Path, n: int,
             spacing: float) -> dict[str, list[float]]:
    import tasks

    out: dict[str, list[float]] = {"bare": [], "chosen": [], "requested": [], "live": []}
    with doubles()[PRIMARY](log_dir / "double-failover") as double, \
            worker(env, [double], [PRIMARY, FALLBACK], log_dir, "failover",
                   # Never paced: the refusals cut daytona's rate, this measures failover.
                   PLAYRUN_START_RATE_COOLDOWN_MS="0",
                   PLAYRUN_START_RATE_INITIAL_PER_MIN="6000",
                   PLAYRUN_START_RATE_MAX_PER_MIN="12000"):
        name = policy("bench-failover", PRIMARY, fallback=FALLBACK)
        adapter = double.provider(log_dir / "bare")
        for i in range(WARM + n):
            t0 = time.time()
            bare = bare_refusal(double, adapter)
            double.push_back("capacity_unavailable")
            handle = tasks.submit_run(NOOP, input={}, org_id="bench", placement=name)
            result = handle.wait(timeout=120)
            assert result.status == "succeeded", result
            if i >= WARM:
                out["bare"].append(bare)
                for key, value in zip(("chosen", "requested", "live"),
                                      failover_marks(handle.id), strict=True):
                    out[key].append(value)
            time.sleep(max(0.0, spacing - (time.time() - t0)))
    return out


# (iii) -------------------------------------------------------------------------------

def goodput(env: dict[str, str], log_dir: Path, providers: list[str], rate: float,
            duration: float, warmup: float, backlog: int) -> dict[str, float]:
    import tasks
    from tasks.store.db import session_scope

    found = doubles()
    outstanding: list[str] = []
    statuses: dict[str, int] = {}
    tag = "-".join(providers)
    with ExitStack() as stack:
        running = [stack.enter_context(found[p](log_dir / f"double-goodput-{tag}-{p}",
                                                creates_per_min=rate)) for p in providers]
        for p in providers:
            reset_bucket(p)
        name = None
        if len(providers) > 1:
            name = policy("bench-split", providers[0], canary=f"{providers[1]}:50")
        stack.enter_context(worker(env, running, providers, log_dir, f"goodput-{tag}",
                                   concurrency=4,
                                   PLAYRUN_START_RATE_MAX_PER_MIN=f"{rate:g}"))

        def accepted() -> tuple[int, int]:
            return (sum(d.creates() for d in running), sum(d.rejected_429() for d in running))

        t0 = time.monotonic()
        mark: tuple[float, int, int] | None = None
        submitted: list[str] = []
        shown = 0.0
        while (now := time.monotonic()) - t0 < warmup + duration:
            if mark is None and now - t0 >= warmup:
                mark = (now, *accepted())
            if now - t0 >= shown + 30:
                shown += 30
                print(f"  {tag} at {shown:.0f} s: {accepted()[0]} creates, "
                      f"{len(outstanding)} outstanding", flush=True)
            outstanding = _still_running(outstanding, statuses, session_scope)
            while len(outstanding) < backlog:
                run_id = tasks.submit_run(NOOP, input={}, org_id="goodput", placement=name).id
                outstanding.append(run_id)
                submitted.append(run_id)
            time.sleep(0.5)
        end = (time.monotonic(), *accepted())
        per_double = {d.name: d.creates() for d in running}
    assert mark is not None
    minutes = (end[0] - mark[0]) / 60
    creates, refused = end[1] - mark[1], end[2] - mark[2]
    return {"per_min": creates / minutes, "creates": creates, "refused": refused,
            **{f"total_{k}": v for k, v in per_double.items()},
            **{f"runs_{k}": v for k, v in statuses.items()},
            **{f"deferred_{k}": v for k, v in deferrals(submitted).items()}}


def deferrals(run_ids: list[str]) -> dict[str, int]:
    """run.deferred events of these runs, by cause."""
    import sqlalchemy as sa

    from models import RunEvent
    from tasks.store.db import session_scope

    cause = RunEvent.data["cause"].as_string()
    with session_scope(readonly=True) as session:
        return {str(c): int(n) for c, n in session.execute(
            sa.select(cause, sa.func.count()).where(
                RunEvent.run_id.in_(run_ids), RunEvent.kind == "run.deferred")
            .group_by(cause))}


# report ------------------------------------------------------------------------------

def ms(values: list[float], p: float) -> str:
    return f"{pct(values, p) * 1000:8.0f} ms" if values else "       -   "


def report(args: argparse.Namespace, over: dict[str, list[float]] | None,
           fail: dict[str, list[float]] | None, good: dict[str, dict[str, float]]) -> None:
    print(f"\n==== bench_placement: n = {args.n} in {args.rounds} rounds, {args.failovers} "
          f"failovers, R = {args.rate:g}/min, goodput {args.duration:g} s after a "
          f"{args.warmup:g} s warm-up, backlog {args.backlog}; 2 shared cores, load "
          f"{os.getloadavg()[0]:.1f}")
    print(f"\n{'':46}{'baseline':>11}{'placement':>12}{'ratio':>8}")
    if over:
        s, p = over["single"], over["placed"]
        for q in (50, 99):
            print(f"(i) submit -> runner started, p{q:<2} (goal 1.05x)  "
                  f"{ms(s, q)} {ms(p, q)}  {pct(p, q) / pct(s, q):5.2f}x")
        for k, label in enumerate(STAGES):
            b, p = over[f"single:{k}"], over[f"placed:{k}"]
            print(f"      {label:40} p50 {ms(b, 50)} {ms(p, 50)}")
        print("    baseline: one provider (daytona), no policy; placement: daytona + local, "
              "policy daytona, fallback local")
    if fail:
        for q in (50, 99):
            print(f"(ii) refusal -> fallback requested, p{q:<2}       "
                  f"{ms(fail['bare'], q)} {ms(fail['requested'], q)}  "
                  f"{pct(fail['requested'], q) / pct(fail['bare'], q):5.2f}x")
        print(f"     refusal -> fallback chosen: p50 {ms(fail['chosen'], 50)}, "
              f"p99 {ms(fail['chosen'], 99)}; -> fallback live: p50 {ms(fail['live'], 50)}, "
              f"p99 {ms(fail['live'], 99)}")
        print("     baseline: the bare daytona SDK create the double refuses")
    if good:
        one = good.get(PRIMARY)
        two = good.get(f"{PRIMARY}+{SECOND}")
        for label, r in good.items():
            ended = {k[5:]: int(v) for k, v in r.items() if k.startswith("runs_")}
            totals = {k[6:]: int(v) for k, v in r.items() if k.startswith("total_")}
            deferred = {k[9:]: int(v) for k, v in r.items() if k.startswith("deferred_")}
            print(f"(iii) creates/min, {label:24}{r['per_min']:8.1f} /min = "
                  f"{r['per_min'] / args.rate:4.2f} R   429s {int(r['refused'])}, "
                  f"creates per double {totals}, runs ended {ended}, deferred {deferred}")
        if one and two:
            print(f"(iii) two providers / one (goal two >= 1.6 R)  {one['per_min']:8.1f}    "
                  f"{two['per_min']:8.1f}  {two['per_min'] / one['per_min']:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--failovers", type=int, default=30)
    parser.add_argument("--rate", type=float, default=60.0, help="R: each double's creates/min")
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--backlog", type=int, default=30)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("overhead", "failover", "goodput"))
    parser.add_argument("--keep", action="store_true", help="keep the logs directory")
    args = parser.parse_args()
    if args.quick:
        args.n, args.rounds, args.failovers = 6, 2, 10
        args.duration, args.warmup = 60.0, 30.0
    stop_on_sigterm()
    found = doubles()
    missing = [p for p in (PRIMARY, SECOND) if p not in found]
    if missing:
        raise SystemExit(f"no double or SDK for {missing}")
    log_dir = Path(tempfile.mkdtemp(prefix="bench-placement-"))
    over = fail = None
    good: dict[str, dict[str, float]] = {}
    try:
        with bench_env(redis_db=14) as env:
            env.update(gateway_env(log_dir))
            env["PLAYRUN_GATEWAY_PUBLIC_URL"] = env["PLAYRUN_GATEWAY_URL"]
            env.update({"PLAYRUN_METRICS_DIR": str(log_dir / "metrics"),
                        "PLAYRUN_METRICS_WORKER_ADDR": "127.0.0.1:0",
                        "PLAYRUN_METRICS_BEAT_ADDR": "127.0.0.1:0",
                        "PLAYRUN_METRICS_GATEWAY_ADDR": "127.0.0.1:0",
                        # Runs wait for starts, not for their org's slots.
                        "PLAYRUN_ORG_CAPACITY": "1000"})
            os.environ.update(env)
            gateway = start_gateway({**os.environ, **env}, log_dir)
            try:
                if args.only in (None, "overhead"):
                    over = overhead(env, log_dir, args.n, args.rounds, 1.2)
                    report(args, over, None, {})
                if args.only in (None, "failover"):
                    fail = failover(env, log_dir, args.failovers, 0.5)
                    report(args, None, fail, {})
                if args.only in (None, "goodput"):
                    for providers in ([PRIMARY], [PRIMARY, SECOND]):
                        good["+".join(providers)] = goodput(
                            env, log_dir, providers, args.rate, args.duration, args.warmup,
                            args.backlog)
                        report(args, None, None, good)
            finally:
                gateway.stop()
    finally:
        if not args.keep:
            shutil.rmtree(log_dir, ignore_errors=True)
    print("\n==== summary")
    report(args, over, fail, good)


if __name__ == "__main__":
    main()
