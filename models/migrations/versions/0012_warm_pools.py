"""warm pools: ready sandboxes per (provider, placement policy), and their members

warm_pools holds an operator's pool (its bounds and time to live); pool_members holds each
warm sandbox from its create to its claim by one attempt or its retirement. A partial index
over ready members serves the claim (the oldest ready member of a pool on a host).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import models

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'warm_pools',
        sa.Column('name', sa.String(length=40), nullable=False),
        sa.Column('provider', sa.String(length=64), nullable=False),
        sa.Column('min_ready', sa.Integer(), nullable=False),
        sa.Column('max_ready', sa.Integer(), nullable=False),
        sa.Column('ttl_s', sa.Float(), nullable=False),
        sa.Column('created_at', models.base.UTCDateTime(timezone=True),
                  server_default=models.base.db_now(), nullable=False),
        sa.Column('updated_at', models.base.UTCDateTime(timezone=True),
                  server_default=models.base.db_now(), nullable=False),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_warm_pools')),
    )
    op.create_table(
        'pool_members',
        sa.Column('id', sa.String(length=32), nullable=False),
        sa.Column('pool', sa.String(length=40), nullable=False),
        sa.Column('provider', sa.String(length=64), nullable=False),
        sa.Column('host', sa.String(length=200), server_default='', nullable=False),
        sa.Column('sandbox_id', sa.String(length=256), nullable=True),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('run_id', sa.String(length=32), nullable=True),
        sa.Column('generation', sa.Integer(), nullable=True),
        sa.Column('created_at', models.base.UTCDateTime(timezone=True),
                  server_default=models.base.db_now(), nullable=False),
        sa.Column('ready_at', models.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column('expires_at', models.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column('claimed_at', models.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column('delivered_at', models.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column('seen_at', models.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_pool_members')),
        sa.UniqueConstraint('provider', 'sandbox_id', name='uq_pool_members_sandbox'),
    )
    with op.batch_alter_table('pool_members', schema=None) as batch_op:
        batch_op.create_index('ix_pool_members_ready', ['pool', 'host', 'ready_at'],
                              unique=False, postgresql_where=sa.text("state = 'ready'"),
                              sqlite_where=sa.text("state = 'ready'"))
        batch_op.create_index('ix_pool_members_state', ['state'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('pool_members', schema=None) as batch_op:
        batch_op.drop_index('ix_pool_members_state')
        batch_op.drop_index('ix_pool_members_ready')
    op.drop_table('pool_members')
    op.drop_table('warm_pools')
