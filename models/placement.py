"""Placement policies: which sandbox provider serves a run, and its org's default."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, JSONType, UTCDateTime, db_now


class PlacementPolicy(Base):
    """A named policy: the primary provider, a canary share and the fallback order."""

    __tablename__ = "placement_policies"

    name: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    provider: Mapped[str] = mapped_column(sa.String(64))
    template: Mapped[str | None] = mapped_column(sa.String(200))
    canary_provider: Mapped[str | None] = mapped_column(sa.String(64))
    canary_pct: Mapped[float] = mapped_column(sa.Float, default=0.0)
    fallback: Mapped[Any] = mapped_column(JSONType)  # provider names, in order
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())


class OrgPlacement(Base):
    """The policy an org's runs take when they name none."""

    __tablename__ = "org_placements"

    org_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    policy: Mapped[str] = mapped_column(
        sa.ForeignKey("placement_policies.name", ondelete="RESTRICT"))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
