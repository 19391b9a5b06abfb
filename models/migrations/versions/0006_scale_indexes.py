"""scale indexes: partial indexes, so each periodic job's batch costs the same at any size

The reaper, the outbox sweep and the resend read only rows that are still open (unsent,
reserved, held, active, undeleted); these indexes hold only those rows, however many
runs, leases and sandboxes have ended.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 13:54:53.034652
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.create_index('ix_attempts_active_expiry', ['lease_expires_at'], unique=False, postgresql_where=sa.text("state = 'active'"), sqlite_where=sa.text("state = 'active'"))

    with op.batch_alter_table('capacity_leases', schema=None) as batch_op:
        batch_op.create_index('ix_capacity_leases_held', ['run_id', 'generation'], unique=False, postgresql_where=sa.text("state IN ('reserved', 'live')"), sqlite_where=sa.text("state IN ('reserved', 'live')"))
        batch_op.create_index('ix_capacity_leases_reserved_expiry', ['expires_at'], unique=False, postgresql_where=sa.text("state = 'reserved'"), sqlite_where=sa.text("state = 'reserved'"))

    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.create_index('ix_outbox_run_created', ['run_id', 'created_at'], unique=False)
        batch_op.create_index('ix_outbox_unsent_due', ['available_at'], unique=False, postgresql_where=sa.text('sent_at IS NULL'), sqlite_where=sa.text('sent_at IS NULL'))

    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index('ix_runs_queued_created', ['created_at'], unique=False, postgresql_where=sa.text("status = 'queued'"), sqlite_where=sa.text("status = 'queued'"))

    with op.batch_alter_table('runtime_resources', schema=None) as batch_op:
        batch_op.create_index('ix_runtime_resources_undeleted', ['run_id', 'generation'], unique=False, postgresql_where=sa.text("state <> 'deleted'"), sqlite_where=sa.text("state <> 'deleted'"))


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index('ix_runs_queued_created', postgresql_where=sa.text("status = 'queued'"), sqlite_where=sa.text("status = 'queued'"))

    with op.batch_alter_table('runtime_resources', schema=None) as batch_op:
        batch_op.drop_index('ix_runtime_resources_undeleted', postgresql_where=sa.text("state <> 'deleted'"), sqlite_where=sa.text("state <> 'deleted'"))

    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.drop_index('ix_outbox_unsent_due', postgresql_where=sa.text('sent_at IS NULL'), sqlite_where=sa.text('sent_at IS NULL'))
        batch_op.drop_index('ix_outbox_run_created')

    with op.batch_alter_table('capacity_leases', schema=None) as batch_op:
        batch_op.drop_index('ix_capacity_leases_reserved_expiry', postgresql_where=sa.text("state = 'reserved'"), sqlite_where=sa.text("state = 'reserved'"))
        batch_op.drop_index('ix_capacity_leases_held', postgresql_where=sa.text("state IN ('reserved', 'live')"), sqlite_where=sa.text("state IN ('reserved', 'live')"))

    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_index('ix_attempts_active_expiry', postgresql_where=sa.text("state = 'active'"), sqlite_where=sa.text("state = 'active'"))

