"""placement: named policies, each org's default, and each run's and attempt's placement

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-10 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from models.base import JSONType, UTCDateTime, db_now

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "placement_policies",
        sa.Column("name", sa.String(40), primary_key=True),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("template", sa.String(200), nullable=True),
        sa.Column("canary_provider", sa.String(64), nullable=True),
        sa.Column("canary_pct", sa.Float(), nullable=False),
        sa.Column("fallback", JSONType, nullable=False),
        sa.Column("updated_at", UTCDateTime(timezone=True), server_default=db_now(), nullable=False),
    )
    op.create_table(
        "org_placements",
        sa.Column("org_id", sa.String(128), primary_key=True),
        sa.Column("policy", sa.String(40),
                  sa.ForeignKey("placement_policies.name", ondelete="RESTRICT"),
                  nullable=False),
        sa.Column("updated_at", UTCDateTime(timezone=True), server_default=db_now(), nullable=False),
    )
    # Nullable without a default: a metadata-only change on PostgreSQL, no table rewrite.
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("placement", sa.String(40), nullable=True))
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("placed_provider", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("placed_provider")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("placement")
    op.drop_table("org_placements")
    op.drop_table("placement_policies")
