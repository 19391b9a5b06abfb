"""holder tokens on sandboxes and capacity leases

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 05:00:46.502841
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import models


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:

    with op.batch_alter_table('capacity_leases', schema=None) as batch_op:
        batch_op.add_column(sa.Column('holder_token', sa.String(length=64), nullable=True))

    with op.batch_alter_table('runtime_resources', schema=None) as batch_op:
        batch_op.add_column(sa.Column('holder_token', sa.String(length=64), nullable=True))

    # Rows of attempts in flight during the upgrade belong to their attempt's holder.
    for table in ('runtime_resources', 'capacity_leases'):
        op.execute(
            f"UPDATE {table} SET holder_token = (SELECT a.lease_token FROM attempts a "
            f"WHERE a.run_id = {table}.run_id AND a.generation = {table}.generation)"
        )


def downgrade() -> None:

    with op.batch_alter_table('runtime_resources', schema=None) as batch_op:
        batch_op.drop_column('holder_token')

    with op.batch_alter_table('capacity_leases', schema=None) as batch_op:
        batch_op.drop_column('holder_token')


