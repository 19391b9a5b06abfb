"""Runtime sheet actions: admit a page, write row results, read rows (docs/design.md).

- `sheet_start_with_intent` admits a page under the run's one write intent for the
  table: the first admission stores its version in the same transaction as its rows,
  later pages, retries and wakes reuse it.
- `sheet_start` is the legacy start: each call without a version mints a new one (a
  retried page re-admits its rows under a newer version). The runner never uses it.
- `sheet_write` writes results of rows admitted under the caller's version; rows owned
  by another version are reported with a reason, never overwritten.
- `sheet_read` reads rows of the run's play's sheet, in key order.

Every action holds the launch fence in the transaction that does its work. Sheets
belong to (org, play name); the run's own record names both.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, Strict, field_validator, model_validator
from sqlalchemy.orm import Session

from tasks.constants import (
    SHEET_MAX_KEY_BYTES,
    SHEET_MAX_PAGE_ROWS,
    SHEET_MAX_ROW_BYTES,
    SheetRowStatus,
)
from tasks.gateway.actions.base import ActionRequest, Context, launch_of
from tasks.parse.untrusted import encoded_size
from tasks.security.tokens import Grant
from tasks.sheets import store
from tasks.store.db import session_scope
from tasks.store.fence import hold_launch

TABLE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
MAX_ERROR_CHARS = 8192


def _key_size(key: str) -> str:
    size = len(key.encode("utf-8"))
    if size > SHEET_MAX_KEY_BYTES:
        raise ValueError(f"a key is {size} bytes; the limit is {SHEET_MAX_KEY_BYTES}")
    return key


Table = Annotated[str, Field(min_length=1, max_length=64, pattern=TABLE_PATTERN)]
Key = Annotated[str, Field(min_length=1), AfterValidator(_key_size)]
Version = Annotated[int, Strict(), Field(gt=0, le=2**62)]


def _bounded(value: Any, what: str) -> Any:
    size = encoded_size(value)
    if size > SHEET_MAX_ROW_BYTES:
        raise ValueError(f"{what} is {size} bytes of JSON; the limit is {SHEET_MAX_ROW_BYTES}")
    return value


def _unique(keys: list[str]) -> None:
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise ValueError(f"key {key[:100]!r} appears more than once")
        seen.add(key)


class AdmitRow(ActionRequest):
    key: Key
    data: dict[str, Any]

    @field_validator("data")
    @classmethod
    def _size(cls, value: dict[str, Any]) -> dict[str, Any]:
        return dict(_bounded(value, "a row"))


class _Page(ActionRequest):
    table: Table
    rows: list[AdmitRow] = Field(max_length=SHEET_MAX_PAGE_ROWS)
    write_version: Version | None = None

    @model_validator(mode="after")
    def _keys(self) -> _Page:
        _unique([r.key for r in self.rows])
        return self


class SheetStart(_Page):
    action: Literal["sheet_start"]


class SheetStartWithIntent(_Page):
    action: Literal["sheet_start_with_intent"]


class WriteRow(ActionRequest):
    key: Key
    status: Literal["done", "failed"]
    result: Any = None
    error: str | None = Field(default=None, max_length=MAX_ERROR_CHARS)

    @model_validator(mode="after")
    def _shape(self) -> WriteRow:
        # The wire schema keeps plain literals: its refusals name "done" and "failed".
        if self.status == SheetRowStatus.DONE.value and self.error is not None:
            raise ValueError("a done row carries a result, not an error")
        failed = self.status == SheetRowStatus.FAILED.value
        if failed and (self.error is None or self.result is not None):
            raise ValueError("a failed row carries an error, not a result")
        _bounded(self.result, "a result")
        return self


class SheetWrite(ActionRequest):
    action: Literal["sheet_write"]
    table: Table
    write_version: Version
    rows: list[WriteRow] = Field(min_length=1, max_length=SHEET_MAX_PAGE_ROWS)

    @model_validator(mode="after")
    def _keys(self) -> SheetWrite:
        _unique([r.key for r in self.rows])
        return self


class SheetRead(ActionRequest):
    action: Literal["sheet_read"]
    table: Table
    keys: list[Key] | None = Field(default=None, max_length=SHEET_MAX_PAGE_ROWS)
    after: Key | None = None
    limit: int = Field(default=500, ge=1, le=SHEET_MAX_PAGE_ROWS)


def _scope(session: Session, grant: Grant) -> tuple[str, str]:
    """Hold the launch fence; the sheet scope is the run's own (org, play name)."""
    run, _attempt = hold_launch(session, launch_of(grant))
    return run.org_id, store.play_name(run.play_path)


def _rows(request: _Page) -> list[tuple[str, dict[str, Any]]]:
    return [(r.key, r.data) for r in request.rows]


def start_with_intent(grant: Grant, request: SheetStartWithIntent,
                      _ctx: Context) -> dict[str, Any]:
    with session_scope() as session:
        org_id, play = _scope(session, grant)
        sheet_id = store.ensure_sheet(session, org_id, play, request.table)
        resolved = store.resolve_stable_intent(session, sheet_id, grant.run_id,
                                               grant.generation, request.table,
                                               request.write_version)
        return store.admit_page(session, sheet_id, resolved.version,
                                _rows(request)).as_dict(request.table)


def start(grant: Grant, request: SheetStart, _ctx: Context) -> dict[str, Any]:
    with session_scope() as session:
        org_id, play = _scope(session, grant)
        sheet_id = store.ensure_sheet(session, org_id, play, request.table)
        if request.write_version is None:
            version = store.mint_legacy(session, sheet_id, grant.run_id, grant.generation)
        else:
            version = store.admitted_version(session, sheet_id, grant.run_id,
                                             request.write_version, request.table)
        return store.admit_page(session, sheet_id, version,
                                _rows(request)).as_dict(request.table)


def write(grant: Grant, request: SheetWrite, _ctx: Context) -> dict[str, Any]:
    with session_scope() as session:
        org_id, play = _scope(session, grant)
        sheet_id = store.find_sheet(session, org_id, play, request.table)
        version = store.admitted_version(session, sheet_id, grant.run_id,
                                         request.write_version, request.table)
        assert sheet_id is not None
        written, rejected = store.write_rows(session, sheet_id, version, [
            store.RowWrite(r.key, r.status, r.result, r.error) for r in request.rows])
    return {"table": request.table, "write_version": version, "written": len(written),
            "rejected": rejected}


def read(grant: Grant, request: SheetRead, _ctx: Context) -> dict[str, Any]:
    with session_scope() as session:
        org_id, play = _scope(session, grant)
        sheet_id = store.find_sheet(session, org_id, play, request.table)
        rows, after = store.read_rows(session, sheet_id, keys=request.keys,
                                      after=request.after, limit=request.limit)
    return {"table": request.table, "rows": rows, "next": after}
