"""Warm pools: ready sandboxes kept for one (provider, placement policy), and their members."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime, db_now, new_id


class WarmPool(Base):
    """An operator's pool: keep between min_ready and max_ready warm sandboxes."""

    __tablename__ = "warm_pools"

    # A placement policy's name, or `default` for runs that name none.
    name: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    provider: Mapped[str] = mapped_column(sa.String(64))
    min_ready: Mapped[int] = mapped_column(sa.Integer)
    max_ready: Mapped[int] = mapped_column(sa.Integer)
    ttl_s: Mapped[float] = mapped_column(sa.Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())


class PoolMember(Base):
    """One warm sandbox: creating -> ready -> claimed (by one attempt) or retiring -> gone."""

    __tablename__ = "pool_members"
    __table_args__ = (
        # The claim: the oldest ready member of a pool on a host.
        sa.Index("ix_pool_members_ready", "pool", "host", "ready_at",
                 postgresql_where=sa.text("state = 'ready'"),
                 sqlite_where=sa.text("state = 'ready'")),
        sa.Index("ix_pool_members_state", "state"),
        sa.UniqueConstraint("provider", "sandbox_id", name="uq_pool_members_sandbox"),
    )

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True, default=new_id)
    pool: Mapped[str] = mapped_column(sa.String(40))
    provider: Mapped[str] = mapped_column(sa.String(64))
    # The host queue of a host-bound provider's sandbox (`local`); '' when any worker reaches it.
    host: Mapped[str] = mapped_column(sa.String(200), default="", server_default="")
    sandbox_id: Mapped[str | None] = mapped_column(sa.String(256))
    state: Mapped[str] = mapped_column(sa.String(16))
    run_id: Mapped[str | None] = mapped_column(sa.String(32))
    generation: Mapped[int | None] = mapped_column(sa.Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Its standby runner took the assignment: from here the play may have run.
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The standby runner's last call: a ready member that stops calling is replaced.
    seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(sa.Text)
