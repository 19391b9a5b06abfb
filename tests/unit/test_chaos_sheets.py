"""The chaos suite's sheet check (bench/chaoslib/sheets.py) on made-up sheets: it must
see a row lost, a wrong value, an extra row and a row whose fn ran twice."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import tasks
from bench.chaoslib.sheets import _play_module, check_sheets, rows_for, table_for
from tasks.sheets.view import SheetRowView

IDX = 4  # the mix's sheet index


def _load(tmp_path: Path) -> Any:
    return SimpleNamespace(marks=tmp_path, org="org", tag="t", kinds={"run": "sheet"},
                           index={"run": IDX})


def _rows(values: dict[str, Any], version: int = 1) -> list[SheetRowView]:
    now = datetime.now(UTC)
    return [SheetRowView(k, {"k": k}, v, "done", version, None, now)
            for k, v in sorted(values.items())]


def _marks(tmp_path: Path, extra: tuple[str, ...] = ()) -> None:
    lines = [f"{IDX}:r{k:03d}" for k in range(rows_for(IDX))] + list(extra)
    (tmp_path / "row").write_text("\n".join(lines) + "\n")


@pytest.fixture
def right() -> dict[str, Any]:
    value = _play_module().sheet_value
    return {f"r{k:03d}": value(IDX, k) for k in range(rows_for(IDX))}


def _check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rows: list[SheetRowView],
           status: str = "succeeded") -> dict[str, Any]:
    seen: list[tuple[str, str, str]] = []

    def fake(org: str, play: str, table: str) -> list[SheetRowView]:
        seen.append((org, Path(play).stem, table))
        return rows
    monkeypatch.setattr(tasks, "sheet_rows", fake)
    out = check_sheets(_load(tmp_path), {"run": status})
    assert seen in ([], [("org", "chaos_mix", table_for("t", IDX))])
    return out


def test_a_sheet_written_once_with_the_right_values_passes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, right: dict[str, Any]) -> None:
    _marks(tmp_path)
    out = _check(monkeypatch, tmp_path, _rows(right))
    assert (out["sheet_runs"], out["sheet_rows"]) == (1, rows_for(IDX))
    assert (out["sheet_wrong"], out["sheet_doubled"], out["sheet_bad"]) == (0, 0, [])


def test_lost_wrong_and_extra_rows_and_a_second_execution_are_counted(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, right: dict[str, Any]) -> None:
    _marks(tmp_path, extra=(f"{IDX}:r003",))
    bad = dict(right)
    del bad["r000"]
    bad["r001"] = {"k": "r001", "v": -1}
    bad["zzz"] = {}
    out = _check(monkeypatch, tmp_path, _rows(bad))
    assert out["sheet_wrong"] == 3 and out["sheet_doubled"] == 1
    assert "r000" in out["sheet_bad"][0] and "zzz" in out["sheet_bad"][0]


def test_a_failed_sheet_run_is_not_read_but_its_executions_are_counted(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _marks(tmp_path, extra=(f"{IDX}:r000",))
    out = _check(monkeypatch, tmp_path, [], status="failed")
    assert (out["sheet_wrong"], out["sheet_doubled"]) == (0, 1)
