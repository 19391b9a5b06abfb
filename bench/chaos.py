"""The chaos suite: one fault kind at a time under a mixed load, and what held.

    python bench/chaos.py [-n 30] [--spread-s 15] [--fault-s 6] [--kinds gateway,redis,...]

Each kind gets its own stack (a `playrun gateway`, beat, two workers of two slots, the
local provider with process isolation) on a fresh PostgreSQL database and Redis db (or
the private servers the kind restarts). n runs of bench/plays/chaos_mix.py (five short
in ten, one mapping 20-50 rows into its own ctx.sheet table, one 4 s long, one failing,
two using ctx.step) are submitted over --spread-s; a third of the way in the fault is
injected. Then a probe run is submitted until one
succeeds (time to recover, from the fault's end), every run is waited for until its
deadline, and releases and sandbox GC get a minute to finish.

Columns: submitted (refused submits shown apart), succeeded, failed by code, unexpected
(a status other than the play's own: a failing play fails, the others succeed), lost
(not terminal at the end), doubled (a play or step that executed twice, by a count of
lines each execution appends to a host file), stuck (terminal later than DEADLINE_S
after admission, or never), capacity slots, resource records and sandboxes left; for
sheet runs, rows that tasks.sheet_rows shows missing, extra, not done or with a value
other than the play's (in runs that succeeded), and rows whose fn ran twice.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.chaoslib.faults import KINDS  # noqa: E402
from bench.chaoslib.harness import DEADLINE_S  # noqa: E402
from bench.chaoslib.suite import Plan, run_kind  # noqa: E402
from bench.common import stop_on_sigterm  # noqa: E402

HELD = ("unexpected", "lost", "doubled", "stuck", "slots", "resources", "sandboxes", "sheet_wrong",
        "sheet_doubled")
RECOVERY_BOUND_S = 60.0  # docs/operations.md's promise: back to work on their own within this


def holds(r: dict[str, Any]) -> bool:
    """The invariants: no outcome other than the play's own, nothing lost, doubled, stuck
    or left held; recovered in bound."""
    recovered = r["no_fault_end"] or (r["recovery_s"] is not None
                                      and r["recovery_s"] <= RECOVERY_BOUND_S)
    return recovered and not any(r[k] for k in HELD)


def table(plan: Plan, results: dict[str, dict[str, Any]]) -> str:
    ran = {k: r for k, r in results.items() if "skipped" not in r and "error" not in r}
    lines = [f"{plan.n} runs per kind over {plan.spread_s:g} s, fault window "
             f"{plan.fault_s:g} s, deadline {DEADLINE_S:g} s, recovery bound "
             f"{RECOVERY_BOUND_S:g} s"]
    names = list(ran)
    cells: list[tuple[str, list[str]]] = []

    def row(label: str, fn: Any) -> None:
        cells.append((label, [str(fn(ran[n])) for n in names]))

    row("submitted (refused)", lambda r: f"{r['submitted']} ({sum(r['submit_errors'].values())})")
    row("succeeded", lambda r: r["succeeded"])
    row("failed by code", lambda r: " ".join(f"{k}:{v}" for k, v in sorted(r["failed"].items()))
        or "-")
    row("unexpected outcome", lambda r: r["unexpected"])
    row("play executions (host)", lambda r: r["executions"])
    row("refused submit, yet ran", lambda r: r["refused_but_ran"])
    row("deferred before code", lambda r: r["deferred"])
    row("start tasks received w0/w1", lambda r: "/".join(
        str(v) for _, v in sorted(r["starts_by_worker"].items())))
    row("  of them after the fault", lambda r: "/".join(
        str(v) for _, v in sorted(r["starts_after_fault"].items()))
        if r.get("starts_after_fault") is not None else "n/a")
    for key, label in (("lost", "lost"), ("doubled", "doubled"), ("stuck", "stuck past deadline"),
                       ("sandboxes", "orphan sandboxes"), ("resources", "resources not deleted"),
                       ("slots", "capacity slots held")):
        row(label, lambda r, key=key: r[key])
    row("sheet runs (rows)", lambda r: f"{r['sheet_runs']} ({r['sheet_rows']})")
    row("  in flight in the fault", lambda r: r.get("sheet_during_fault", "?"))
    row("sheet rows wrong/missing", lambda r: r["sheet_wrong"])
    row("sheet rows run twice", lambda r: r["sheet_doubled"])
    row("time to recover, s", lambda r: "n/a (no end)" if r["no_fault_end"] else
        (f"{r['recovery_s']:.1f}" if r["recovery_s"] is not None else "never"))
    row("probe run, no fault, s", lambda r: f"{r['baseline_s']:.1f}"
        if r["baseline_s"] is not None else "never")
    row("load average (1 min)", lambda r: f"{r['load']:.1f}")
    row("invariants", lambda r: "hold" if holds(r) else "BROKEN")
    # Columns as wide as their widest cell: a long "failed by code" must not run into the next.
    width = max([20, *(len(n) + 2 for n in names),
                 *(len(c) + 2 for _, row_cells in cells for c in row_cells)])
    lines.append(f"{'':26}" + "".join(f"{n:>{width}}" for n in names))
    lines.extend(f"{label:26}" + "".join(f"{c:>{width}}" for c in row_cells)
                 for label, row_cells in cells)
    for name, r in ran.items():
        for bad in r["sheet_bad"]:
            lines.append(f"{name}: sheet rows wrong in run {bad}")
        lines.extend(f"{name}: unexpected: {u}" for u in r.get("unexpected_sample", []))
    for name, r in results.items():
        for what in ("skipped", "error"):
            if what in r:
                lines.append(f"{name}: {what}: {r[what]}")
    return "\n".join(lines)


def run_isolated(key: str, plan: Plan) -> dict[str, Any]:
    """One kind in its own process: the Celery app reads its broker URL once, at import,
    and every kind has its own Redis."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        argv = [sys.executable, __file__, "--one", key, "--out", out.name, "-n", str(plan.n),
                "--spread-s", str(plan.spread_s), "--fault-s", str(plan.fault_s)]
        if plan.keep_logs:
            argv.append("--keep-logs")
        done = subprocess.run(argv, check=False)
        text = Path(out.name).read_text()
    if done.returncode != 0 or not text:
        return {"error": f"the suite itself failed (exit {done.returncode}; see above)"}
    result: dict[str, Any] = json.loads(text)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--spread-s", type=float, default=15.0)
    parser.add_argument("--fault-s", type=float, default=6.0)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="comma-separated, from: " + ", ".join(KINDS))
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--json", help="also write every kind's figures to this file")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child run: this kind only
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    stop_on_sigterm()
    plan = Plan(n=args.n, spread_s=args.spread_s, fault_s=args.fault_s,
                keep_logs=args.keep_logs)
    if args.one:
        Path(args.out).write_text(json.dumps(run_kind(KINDS[args.one](), plan)))
        return
    results: dict[str, dict[str, Any]] = {}
    for key in args.kinds.split(","):
        fault = KINDS[key.strip()]()
        print(f"--- {fault.name}: {fault.describe}", flush=True)
        results[fault.name] = run_isolated(key.strip(), plan)
        print(table(plan, {fault.name: results[fault.name]}), flush=True)
    print("\n" + table(plan, results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    sys.exit(0 if all("error" not in r and holds(r) for r in results.values()
                      if "skipped" not in r) else 1)


if __name__ == "__main__":
    main()
