"""runs listing: keyset indexes on (created_at, id), for all orgs and per org

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 13:40:00
"""

from __future__ import annotations

from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index('ix_runs_created_id', ['created_at', 'id'], unique=False)
        batch_op.create_index('ix_runs_org_created_id', ['org_id', 'created_at', 'id'],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index('ix_runs_org_created_id')
        batch_op.drop_index('ix_runs_created_id')
