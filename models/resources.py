"""Sandboxes (runtime resources), capacity leases and per-org limits."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, JSONType, UTCDateTime, db_now, new_id


class RuntimeResource(Base):
    """A sandbox created for an attempt, from request to deletion."""

    __tablename__ = "runtime_resources"
    __table_args__ = (
        sa.UniqueConstraint("provider", "sandbox_id", name="uq_resources_sandbox"),
        # The reaper's retry of releases: only sandboxes not yet deleted.
        sa.Index("ix_runtime_resources_undeleted", "run_id", "generation",
                 postgresql_where=sa.text("state <> 'deleted'"),
                 sqlite_where=sa.text("state <> 'deleted'")),
    )

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True, default=new_id)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    generation: Mapped[int] = mapped_column(sa.Integer)
    provider: Mapped[str] = mapped_column(sa.String(64))
    sandbox_id: Mapped[str] = mapped_column(sa.String(256))
    labels: Mapped[Any] = mapped_column(JSONType)
    state: Mapped[str] = mapped_column(sa.String(16), index=True)
    # The lease token of the attempt holder that owns it: a deferral resumes the same
    # generation under a new token, so releases never touch the next holder's rows.
    holder_token: Mapped[str | None] = mapped_column(sa.String(64))
    last_error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class CapacityOrg(Base):
    """Per-org limit override, and the row reservations lock to serialise per org."""

    __tablename__ = "capacity_orgs"

    org_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    limit: Mapped[int | None] = mapped_column(sa.Integer)
    # Its share of the fleet's start rate against other orgs with runs waiting.
    weight: Mapped[int] = mapped_column(sa.Integer, default=1, server_default="1")
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())


class CapacityLease(Base):
    """One of an org's concurrent-sandbox slots: reserved -> live -> released."""

    __tablename__ = "capacity_leases"
    __table_args__ = (
        sa.Index("ix_capacity_leases_org_state", "org_id", "state"),
        sa.Index("ix_capacity_leases_attempt", "run_id", "generation"),
        # The reaper: reservations that may expire, and held leases to retry releasing.
        sa.Index("ix_capacity_leases_reserved_expiry", "expires_at",
                 postgresql_where=sa.text("state = 'reserved'"),
                 sqlite_where=sa.text("state = 'reserved'")),
        sa.Index("ix_capacity_leases_held", "run_id", "generation",
                 postgresql_where=sa.text("state IN ('reserved', 'live')"),
                 sqlite_where=sa.text("state IN ('reserved', 'live')")),
    )

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True, default=new_id)
    org_id: Mapped[str] = mapped_column(sa.String(128))
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    generation: Mapped[int] = mapped_column(sa.Integer)
    state: Mapped[str] = mapped_column(sa.String(16))
    holder_token: Mapped[str | None] = mapped_column(sa.String(64))
    provider: Mapped[str | None] = mapped_column(sa.String(64))
    sandbox_id: Mapped[str | None] = mapped_column(sa.String(256))
    overrun: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    reserved_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    live_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class TrafficPolicy(Base):
    """An operator switch for sandbox starts; the newest unexpired row is in force."""

    __tablename__ = "traffic_policies"

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    mode: Mapped[str] = mapped_column(sa.String(32))
    starts_per_minute: Mapped[float | None] = mapped_column(sa.Float)
    reason: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
