"""Tables of the CLI: on a terminal they fit its width by dropping the least useful columns
and shortening the flexible ones, never breaking a value inside a word; piped or redirected
they are tab-separated rows under a header line, every value whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from rich.console import Console
from rich.text import Text

# Columns are separated by this many spaces on a terminal.
_GAP = 2
# A shortened column keeps at least this many characters (its ellipsis included).
_MIN_FLEX = 8
# A time-ordered id's first 12 digits are its millisecond: 4 more tell runs of one apart.
SHORT_ID = 16


@dataclass(frozen=True)
class Column:
    header: str
    # Dropped first when the table is too wide: higher drops earlier; 0 is never dropped.
    drop: int = 0
    # Shortened (with an ellipsis) before anything is dropped; never for ids or states.
    flex: bool = False


@dataclass(frozen=True)
class Table:
    columns: Sequence[Column]
    # What a terminal shows, one tuple per row, as wide as columns.
    rows: Sequence[Sequence[str]]
    # What a pipe gets: whole values (full ids, ISO times); defaults to rows.
    plain: Sequence[Sequence[str]] | None = None


def short_id(run_id: str) -> str:
    """Enough of a run id for `show` and `cancel`, which take a unique prefix."""
    return run_id[:SHORT_ID]


def ago(at: datetime | None, now: datetime | None = None) -> str:
    """A time relative to now, compactly: `45s ago`, `12m ago`, `3h ago`, `in 2d`."""
    if at is None:
        return ""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    seconds = ((now or datetime.now(UTC)) - at).total_seconds()
    later, seconds = seconds < 0, abs(seconds)
    for size, unit in ((86400 * 365, "y"), (86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            amount = f"{int(seconds // size)}{unit}"
            break
    else:
        amount = f"{int(seconds)}s"
    return f"in {amount}" if later else f"{amount} ago"


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int
        ) -> tuple[list[int], list[int]]:
    """Which columns to show and how wide, so a line is at most `width` characters."""
    keep = list(range(len(columns)))
    natural = [max([len(columns[i].header), *(len(r[i]) for r in rows)]) for i in keep]

    def shrunk(kept: list[int]) -> list[int] | None:
        widths = {i: natural[i] for i in kept}
        over = sum(widths.values()) + _GAP * (len(kept) - 1) - width
        flexible = sorted((i for i in kept if columns[i].flex), key=lambda i: -widths[i])
        for i in flexible:  # the widest flexible column gives way first
            if over <= 0:
                break
            floor = max(_MIN_FLEX, len(columns[i].header))
            give = min(over, widths[i] - floor) if widths[i] > floor else 0
            widths[i] -= give
            over -= give
        return [widths[i] for i in kept] if over <= 0 else None

    while True:
        widths = shrunk(keep)
        droppable = [i for i in keep if columns[i].drop]
        if widths is not None or not droppable:
            return keep, widths or [natural[i] for i in keep]
        keep.remove(max(droppable, key=lambda i: (columns[i].drop, i)))


def show(out: Console, table: Table) -> None:
    """The table on a terminal fitted to its width; tab-separated lines when piped."""
    if not out.is_terminal:
        for line in tsv(table):
            out.file.write(line + "\n")
        out.file.flush()
        return
    keep, widths = fit(table.columns, table.rows, out.width)
    header = "  ".join(table.columns[i].header.ljust(w) for i, w in zip(keep, widths, strict=True))
    out.print(Text(header.rstrip(), style="bold"), soft_wrap=True)
    for row in table.rows:
        cells = [_shorten(row[i], w).ljust(w) for i, w in zip(keep, widths, strict=True)]
        out.print(Text("  ".join(cells).rstrip()), soft_wrap=True)


def tsv(table: Table) -> list[str]:
    """Header and rows, tab-separated; a tab or newline inside a value becomes a space."""
    def line(cells: Sequence[str]) -> str:
        return "\t".join(" ".join(c.split("\t")).replace("\n", " ") for c in cells)

    rows = table.plain if table.plain is not None else table.rows
    return [line([c.header for c in table.columns]), *(line(r) for r in rows)]
