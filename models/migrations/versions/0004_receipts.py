"""receipts: work receipts for ctx.step (docs/design.md)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 10:29:52.502134
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import models

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('work_receipts',
    sa.Column('receipt_key', sa.String(length=64), nullable=False),
    sa.Column('org_id', sa.String(length=128), nullable=False),
    sa.Column('play', sa.String(length=255), nullable=False),
    sa.Column('step_key', sa.String(length=1024), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('owner_run_id', sa.String(length=32), nullable=False),
    sa.Column('owner_generation', sa.Integer(), nullable=False),
    sa.Column('owner_launch_id', sa.String(length=32), nullable=False),
    sa.Column('claim_id', sa.String(length=64), nullable=False),
    sa.Column('claim_count', sa.Integer(), server_default='1', nullable=False),
    sa.Column('output', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('code', sa.String(length=64), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.Column('updated_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.Column('claimed_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.Column('completed_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.Column('expires_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.Column('released_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('receipt_key', name=op.f('pk_work_receipts'))
    )
    with op.batch_alter_table('work_receipts', schema=None) as batch_op:
        batch_op.create_index('ix_work_receipts_org_play', ['org_id', 'play'], unique=False)
        batch_op.create_index('ix_work_receipts_owner', ['owner_run_id', 'owner_generation'], unique=False)
        batch_op.create_index(batch_op.f('ix_work_receipts_status'), ['status'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('work_receipts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_work_receipts_status'))
        batch_op.drop_index('ix_work_receipts_owner')
        batch_op.drop_index('ix_work_receipts_org_play')

    op.drop_table('work_receipts')
