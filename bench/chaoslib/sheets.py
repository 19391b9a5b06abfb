"""What a user checks after each sheet run of the chaos mix: every row written exactly
once with the right value (read through tasks.sheet_rows), and each row's fn executed
once (a line per execution in a host file, like the play's own mark)."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from typing import Any

PLAY = Path(__file__).resolve().parent.parent / "plays" / "chaos_mix.py"
ROW_S = 0.2  # per row: 20-50 rows take 4-10 s, so a fault lands mid-map in a run or two


def rows_for(i: int) -> int:
    return 20 + (i * 7) % 31


def table_for(tag: str, i: int) -> str:
    return f"chaos-{tag}-{i}"


def _play_module() -> Any:
    """The play itself, for sheet_value: the harness expects what the play writes."""
    spec = importlib.util.spec_from_file_location("chaos_mix_play", PLAY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_sheets(load: Any, statuses: dict[str, str]) -> dict[str, Any]:
    """Per sheet run: rows missing, extra, not done or with a wrong value (only for a run
    that succeeded: a failed run may leave rows pending) and rows whose fn ran twice."""
    import tasks

    value = _play_module().sheet_value
    path = load.marks / "row"
    executed = Counter(path.read_text().split()) if path.exists() else Counter()
    runs = rows = wrong = twice = 0
    bad: list[str] = []
    for rid, kind in load.kinds.items():
        if kind != "sheet":
            continue
        i, n = load.index[rid], rows_for(load.index[rid])
        runs, rows = runs + 1, rows + n
        twice += sum(1 for k in range(n) if executed[f"{i}:r{k:03d}"] > 1)
        if statuses.get(rid) != "succeeded":
            continue
        found = tasks.sheet_rows(load.org, str(PLAY), table_for(load.tag, i))
        want = {f"r{k:03d}": value(i, k) for k in range(n)}
        got = {r.key: r for r in found}
        versions = {r.write_version for r in found}
        off = [k for k, v in want.items() if k not in got or got[k].status != "done"
               or got[k].result != v] + [k for k in got if k not in want]
        off += [] if len(found) == len(got) and len(versions) <= 1 else ["<versions>"]
        wrong += len(off)
        if off:
            bad.append(f"{rid}: {off[:5]}")
    return {"sheet_runs": runs, "sheet_rows": rows, "sheet_wrong": wrong,
            "sheet_doubled": twice, "sheet_bad": bad[:10]}
