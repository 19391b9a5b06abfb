"""`playrun prune`: retention by hand, with a dry run and a JSON-lines export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.constants import RETENTION_BATCH_MAX
from tasks.maintenance.retention import prune
from tasks.parse.checks import check_count, check_text, parse_count
from tasks.parse.durations import parse_duration
from tasks.store.db import ensure_schema_once


def run_prune(older_than: str, dry_run: bool, export: str | None, batch: str) -> dict[str, Any]:
    """Every batch until nothing older is left; the report as a JSON-ready dict."""
    seconds = parse_duration(older_than)  # DURATION_INVALID: banana, -1d, 0
    size = check_count(parse_count(batch, "--batch"), "--batch", minimum=1,
                       maximum=RETENTION_BATCH_MAX)  # INPUT_INVALID
    directory = Path(check_text(export, "--export", 4096)) if export is not None else None
    ensure_schema_once()
    report = prune(seconds, batch=size, dry_run=dry_run, export_dir=directory)
    ms = sorted(report.batch_ms)
    return {"dry_run": dry_run, "older_than_s": seconds,
            "deleted": report.deleted, "batches": len(ms),
            "batch_ms_median": round(ms[len(ms) // 2], 2) if ms else None,
            "batch_ms_max": round(ms[-1], 2) if ms else None,
            "export": str(directory) if directory is not None else None}
