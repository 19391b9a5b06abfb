"""Work receipts: one durable, idempotent record per step of a play (docs/design.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, JSONType, UTCDateTime, db_now


class WorkReceipt(Base):
    """Keyed by sha256 of (org, play name, step key); the owner is the attempt's launch that
    claimed it. No foreign key to runs: a receipt outlives the run that computed it."""

    __tablename__ = "work_receipts"
    __table_args__ = (
        sa.Index("ix_work_receipts_org_play", "org_id", "play"),
        sa.Index("ix_work_receipts_owner", "owner_run_id", "owner_generation"),
        # Retention deletes released receipts oldest first.
        sa.Index("ix_work_receipts_released", "released_at",
                 postgresql_where=sa.text("status = 'released'"),
                 sqlite_where=sa.text("status = 'released'")),
    )

    receipt_key: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    org_id: Mapped[str] = mapped_column(sa.String(128))
    play: Mapped[str] = mapped_column(sa.String(255))
    step_key: Mapped[str] = mapped_column(sa.String(1024))
    # pending / running (held by the owner), completed, failed, released.
    status: Mapped[str] = mapped_column(sa.String(16), index=True)
    owner_run_id: Mapped[str] = mapped_column(sa.String(32))
    owner_generation: Mapped[int] = mapped_column(sa.Integer)
    owner_launch_id: Mapped[str] = mapped_column(sa.String(32))
    # The runner's id for one ctx.step call: a retried claim or complete is recognised.
    claim_id: Mapped[str] = mapped_column(sa.String(64))
    claim_count: Mapped[int] = mapped_column(sa.Integer, default=1, server_default="1")
    output: Mapped[Any] = mapped_column(JSONType, nullable=True)
    code: Mapped[str | None] = mapped_column(sa.String(64))
    error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # A completed receipt is reused until then (no expiry without a ttl).
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
