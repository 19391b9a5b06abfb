"""Runtime sheets: versioned tables of rows a play fills, and the write intents that own them.

The invariants live in the database:
- one sheet per (org, play, table); its `last_version` counter is bumped under the row
  lock, so every version minted for a sheet is newer than all before it;
- one row per (sheet, key), stamped with the write version that admitted it;
- each version of a sheet belongs to one intent (primary key), and a run has at most
  one stable intent per sheet (`intent_key` is the run id for stable intents and NULL
  for legacy ones; NULLs never collide).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, JSONType, UTCDateTime, db_now

# Keys sort by code point everywhere (PostgreSQL's "C" collation is SQLite's BINARY), so
# `ORDER BY key` and keyset pages agree with Python's sorted().
KEY_TYPE = sa.String(1024).with_variant(sa.String(1024, collation="C"), "postgresql")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class Sheet(Base):
    __tablename__ = "sheets"
    __table_args__ = (
        sa.UniqueConstraint("org_id", "play", "name", name="uq_sheets_org_play_name"),
        sa.CheckConstraint("last_version >= 0", name="last_version_nonnegative"),
    )

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    org_id: Mapped[str] = mapped_column(sa.String(128))
    play: Mapped[str] = mapped_column(sa.String(256))
    name: Mapped[str] = mapped_column(sa.String(64))
    # The newest write version minted for this sheet; bumped under the row lock.
    last_version: Mapped[int] = mapped_column(sa.BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())


class SheetRow(Base):
    __tablename__ = "sheet_rows"
    __table_args__ = (
        sa.CheckConstraint("status IN ('pending', 'done', 'failed')", name="status_known"),
        sa.CheckConstraint("write_version > 0", name="write_version_positive"),
    )

    sheet_id: Mapped[int] = mapped_column(sa.ForeignKey("sheets.id", ondelete="CASCADE"),
                                          primary_key=True)
    key: Mapped[str] = mapped_column(KEY_TYPE, primary_key=True)
    data: Mapped[Any] = mapped_column(JSONType)
    result: Mapped[Any] = mapped_column(JSONType, nullable=True)
    error: Mapped[str | None] = mapped_column(sa.Text)
    status: Mapped[str] = mapped_column(sa.String(16))
    # The version that admitted this row; only a writer carrying it may write its result.
    write_version: Mapped[int] = mapped_column(sa.BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())


class SheetWriteIntent(Base):
    """One write version of a sheet and the run that admitted it."""

    __tablename__ = "sheet_write_intents"
    __table_args__ = (
        sa.UniqueConstraint("sheet_id", "intent_key", name="uq_sheet_write_intents_key"),
        sa.CheckConstraint("version > 0", name="version_positive"),
        sa.Index("ix_sheet_write_intents_run", "run_id"),
    )

    sheet_id: Mapped[int] = mapped_column(sa.ForeignKey("sheets.id", ondelete="CASCADE"),
                                          primary_key=True)
    version: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    # The attempt that first admitted it (later attempts of the same run reuse it).
    generation: Mapped[int] = mapped_column(sa.Integer)
    kind: Mapped[str] = mapped_column(sa.String(16))
    status: Mapped[str] = mapped_column(sa.String(16))
    # The run id for a stable intent (one per run and sheet); NULL for legacy versions.
    intent_key: Mapped[str | None] = mapped_column(sa.String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
