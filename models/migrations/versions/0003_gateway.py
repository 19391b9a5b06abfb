"""gateway: launches, heartbeats, progress deliveries, trouble passes

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 09:56:43.113506
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import models


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('event_deliveries',
    sa.Column('run_id', sa.String(length=32), nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.Column('created_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_event_deliveries_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'idempotency_key', name=op.f('pk_event_deliveries'))
    )
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('launch_id', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('host_queue', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('last_heartbeat_at', models.base.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('unreachable_at', models.base.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('progress_count', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('progress_dropped', sa.Integer(), server_default='0', nullable=False))

    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('trouble_count', sa.Integer(), server_default='0', nullable=False))



def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('trouble_count')

    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('progress_dropped')
        batch_op.drop_column('progress_count')
        batch_op.drop_column('unreachable_at')
        batch_op.drop_column('last_heartbeat_at')
        batch_op.drop_column('host_queue')
        batch_op.drop_column('launch_id')

    op.drop_table('event_deliveries')
