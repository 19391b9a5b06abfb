"""Runtime sheets, the play's side: `ctx.sheet(table).map(rows, fn, key="field")`.

Standard library only; copied into each sandbox as playrun_sheets.py beside runner.py.
`map` admits the rows in pages under the run's write intent (`sheet_start_with_intent`:
the first page stores the version, later pages, retries and wakes reuse it), calls `fn`
once per row not already done under that intent, writes each row's result (or its
error) back in chunks, and returns the results in row order.

A writer told that its rows belong to another write version stops: the run fails
RUNTIME_SHEET_ATTEMPT_SUPERSEDED, even if the play catches the error. A gateway that
does not offer the intent start fails the run RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE;
this module never falls back to the legacy `sheet_start`. Row checks: runner_sheetrows.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the host imports the runner's files as tasks.execution.*
    from tasks import protocol
    from tasks.execution import runner_client as client
    from tasks.execution import runner_sheetrows as rows_
else:  # in the sandbox they are flat files beside runner.py
    import playrun_client as client
    import playrun_protocol as protocol
    import playrun_sheetrows as rows_

MAX_REQUEST_BYTES = 1024 * 1024  # rows per request are also bounded by bytes
PAGE_ROWS = 500
WRITE_ROWS = 200
PROGRESS_EVERY_S = 1.0  # at most one progress event a second per map
FLUSH_EVERY_S = 2.0  # results wait at most this long (between rows) before they are written
RETRY_FOR_S = 120.0  # an unreachable gateway is retried this long, then the map fails
REASONS = ("newer_write_version", "older_write_version", "already_terminal", "unreported")
BENIGN = frozenset({"already_terminal"})  # nothing is overwritten: the row was written


class SheetError(Exception):
    """A sheet call failed (a refusal, or the gateway unreachable for too long)."""


class SheetRefusedError(SheetError):
    def __init__(self, action: str, code: str, error: str) -> None:
        super().__init__(f"{action} was refused: {code}: {error}")
        self.code = code


class RuntimeSheetStop(SheetError):
    """This run must stop: nothing it writes to the sheet can be accepted any more."""

    code = protocol.PLAY_ERROR


class RuntimeSheetAttemptSupersededError(RuntimeSheetStop):
    code = protocol.RUNTIME_SHEET_ATTEMPT_SUPERSEDED

    def __init__(
        self,
        message: str,
        table: str,
        write_version: int | None,
        submitted: int,
        rows: list[dict[str, Any]],
    ) -> None:
        super().__init__(message)
        self.table = table
        self.write_version = write_version
        self.submitted = submitted
        self.superseded_rows = rows


class RuntimeSheetWriteIntentUnavailableError(RuntimeSheetStop):
    code = protocol.RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE


class MapResult(list[Any]):
    """`map`'s results in row order; a failed row's entry is None and its error in `errors`."""

    def __init__(self, size: int) -> None:
        super().__init__([None] * size)
        self.errors: dict[str, str] = {}


def _rows_setting(uplink: Any, index: int, default: int) -> int:
    """A size the worker's settings handed the runner (taken out of the play's sight)."""
    try:
        value = int(getattr(uplink, "sheet_rows", ("", ""))[index])
    except (ValueError, TypeError, IndexError):
        return default
    return value if value > 0 else default


class Sheet:
    """One table of this play's sheets, for this run (`ctx.sheet(table)`)."""

    def __init__(
        self, ctx: Any, table: str, *, page_rows: int | None = None, write_rows: int | None = None
    ) -> None:
        self.table = rows_.check_table(table)
        self._ctx = ctx
        self._uplink = getattr(ctx, "_uplink", None)
        self.page_rows = page_rows or _rows_setting(self._uplink, 0, PAGE_ROWS)
        self.write_rows = write_rows or _rows_setting(self._uplink, 1, WRITE_ROWS)
        self.write_version: int | None = None
        self._done = self._total = 0
        self._reported = 0.0

    # --- the gateway -------------------------------------------------------------------

    def _halt(self, error: RuntimeSheetStop) -> RuntimeSheetStop:
        """Record the stop on the context: the runner fails the run with it regardless."""
        if getattr(self._ctx, "halted", None) is None:
            self._ctx.halted = (error.code, str(error))
        return error

    def _call(self, body: dict[str, Any]) -> dict[str, Any]:
        halted = getattr(self._ctx, "halted", None)
        if halted is not None:
            raise RuntimeSheetStop(f"this run was stopped: {halted[1]}")
        if self._uplink is None:
            raise SheetError("runtime sheets need the gateway; this runner has none")
        action = body["action"]
        try:
            answer = client.call_until(self._uplink, body, time.monotonic() + RETRY_FOR_S)
        except client.Refused as exc:
            if (
                action == protocol.ACTION_SHEET_START_WITH_INTENT
                and exc.code == protocol.GATEWAY_UNKNOWN_ACTION
            ):
                raise self._halt(
                    RuntimeSheetWriteIntentUnavailableError(
                        f"this gateway does not offer sheet write intents ({exc.error}); "
                        f"sheet {self.table!r} was not admitted. Retry after the gateway "
                        "is upgraded."
                    )
                ) from None
            raise SheetRefusedError(action, exc.code, exc.error) from None
        except client.Unavailable as exc:
            raise SheetError(
                f"{action} on sheet {self.table!r}: the gateway was "
                f"unavailable for {RETRY_FOR_S:g} s: {exc}"
            ) from None
        if not isinstance(answer, dict):
            raise SheetError(f"{action}: the gateway's answer is not an object")
        return answer

    def _superseded(
        self, stale: list[dict[str, Any]], submitted: int, what: str
    ) -> RuntimeSheetStop:
        counts: dict[str, int] = {}
        for row in stale:
            counts[row["reason"]] = counts.get(row["reason"], 0) + 1
        reasons = ", ".join(f"{r}={n}" for r, n in sorted(counts.items()))
        sample = "; ".join(
            f"key={str(r.get('key'))[:80]} row_write_version={r.get('write_version') or 'unknown'}"
            for r in stale[:5]
        )
        run = getattr(self._ctx, "run_id", None) or "?"
        return self._halt(
            RuntimeSheetAttemptSupersededError(
                f"sheet {self.table!r} rejected {len(stale)} of {submitted} row {what} from run "
                f"{run} at write version {self.write_version} because the rows are owned by a "
                f"different write version ({reasons}). This attempt was superseded by a newer "
                f"admission of these rows and stops: nothing it writes from here on can be "
                f"accepted. Sample: {sample}.",
                self.table,
                self.write_version,
                submitted,
                stale,
            )
        )

    @staticmethod
    def _stale(rows: Any) -> list[dict[str, Any]]:
        out = []
        for row in rows if isinstance(rows, list) else []:
            row = row if isinstance(row, dict) else {}
            reason = row.get("reason")
            out.append(
                {
                    "key": row.get("key"),
                    "write_version": row.get("write_version"),
                    "reason": reason if reason in REASONS else "unreported",
                }
            )
        return out

    # --- admission and writes ----------------------------------------------------------

    def _admit(self, page: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        answer = self._call(
            {
                "action": protocol.ACTION_SHEET_START_WITH_INTENT,
                "table": self.table,
                "write_version": self.write_version,
                "rows": [{"key": k, "data": row} for k, row in page],
            }
        )
        version = answer.get("write_version")
        if not isinstance(version, int) or (self.write_version not in (None, version)):
            raise SheetError(
                f"sheet {self.table!r}: the gateway admitted version {version!r}"
                f", not {self.write_version}"
            )
        self.write_version = version
        stale = self._stale(answer.get("superseded"))
        if stale:
            raise self._superseded(stale, len(page), "admission(s)")
        return answer

    def _write(self, items: list[dict[str, Any]]) -> None:
        answer = self._call(
            {
                "action": protocol.ACTION_SHEET_WRITE,
                "table": self.table,
                "write_version": self.write_version,
                "rows": items,
            }
        )
        stale = [r for r in self._stale(answer.get("rejected")) if r["reason"] not in BENIGN]
        if stale:
            raise self._superseded(stale, len(items), "write(s)")

    @staticmethod
    def _pages(items: list[Any], sizes: list[int], rows: int) -> Iterator[list[Any]]:
        page: list[Any] = []
        used = 0
        for item, size in zip(items, sizes, strict=True):
            if page and (len(page) >= rows or used + size > MAX_REQUEST_BYTES):
                yield page
                page, used = [], 0
            page.append(item)
            used += size + 32
        if page:
            yield page

    def _progress(self, *, force: bool = False) -> None:
        """Rows done of the map's total, to the run's ledger: at most once a second."""
        now = time.monotonic()
        log = getattr(self._ctx, "log", None)
        if log is None or not (force or now - self._reported >= PROGRESS_EVERY_S):
            return
        self._reported = now
        log(
            f"sheet {self.table}: {self._done}/{self._total} rows",
            table=self.table,
            done=self._done,
            total=self._total,
        )

    def map(self, rows: Iterable[Any], fn: Callable[[Any], Any], *, key: str) -> MapResult:
        """fn(row) for each row not already done under this run's write intent, in pages;
        the results (stored ones for rows already done) in row order."""
        if not callable(fn):
            raise TypeError("map needs a callable fn(row)")
        if not isinstance(key, str) or not key:
            raise TypeError("map needs key=, the name of each row's identifying field")
        items, keys, sizes = rows_.prepare(rows, key)
        results = MapResult(len(items))
        self._done, self._total = 0, len(items)
        self._reported = time.monotonic()
        for page in self._pages(list(range(len(items))), sizes, self.page_rows):
            self._map_page(page, items, keys, fn, results)
        self._progress(force=True)
        return results

    def _map_page(
        self,
        page: list[int],
        items: list[Any],
        keys: list[str],
        fn: Callable[[Any], Any],
        results: MapResult,
    ) -> None:
        answer = self._admit([(keys[i], items[i]) for i in page])
        todo = set(answer.get("todo") or [])
        reused = {r.get("key"): r for r in answer.get("done") or [] if isinstance(r, dict)}
        if len(todo) + len(reused) != len(page) or not all(
            keys[i] in todo or keys[i] in reused for i in page
        ):
            raise SheetError(
                f"sheet {self.table!r}: the gateway's answer does not account "
                f"for the {len(page)} rows of the page"
            )
        omitted = [str(k) for k, r in reused.items() if r.get("omitted")]
        if omitted:  # outcomes too large to come with the admission: read them
            reused.update({r["key"]: r for r in self.rows(keys=omitted)})
        pending: list[dict[str, Any]] = []
        pending_bytes = 0
        last_flush = time.monotonic()
        for i in page:
            if keys[i] in reused:  # done under this intent already: its stored outcome
                row = reused[keys[i]]
                results[i] = row.get("result")
                if row.get("status") == "failed":
                    results.errors[keys[i]] = str(row.get("error"))
                self._done += 1
                continue
            value, error, size = rows_.outcome(fn, items[i])
            results[i] = value
            if error is None:
                pending.append({"key": keys[i], "status": "done", "result": value})
            else:
                results.errors[keys[i]] = error
                pending.append({"key": keys[i], "status": "failed", "error": error})
            pending_bytes += len(keys[i]) + size + 64
            self._done += 1
            now = time.monotonic()
            if (
                len(pending) >= self.write_rows
                or pending_bytes > MAX_REQUEST_BYTES // 2
                or now - last_flush >= FLUSH_EVERY_S
            ):
                self._write(pending)
                pending, pending_bytes, last_flush = [], 0, now
            self._progress()
        if pending:
            self._write(pending)
        self._progress()

    # --- reads -------------------------------------------------------------------------

    def rows(self, keys: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Rows of this sheet (all, or those with `keys`) in key order: key, status,
        write_version, data, result, error."""
        wanted = None if keys is None else [str(k) for k in keys]
        out: list[dict[str, Any]] = []
        for start in range(0, len(wanted) if wanted is not None else 1, PAGE_ROWS):
            chunk = None if wanted is None else wanted[start : start + PAGE_ROWS]
            after = None
            while True:
                answer = self._call(
                    {
                        "action": protocol.ACTION_SHEET_READ,
                        "table": self.table,
                        "keys": chunk,
                        "after": after,
                        "limit": PAGE_ROWS,
                    }
                )
                out.extend(answer.get("rows") or [])
                after = answer.get("next")
                if not after:
                    break
        return sorted(out, key=lambda r: r["key"]) if wanted is not None else out
