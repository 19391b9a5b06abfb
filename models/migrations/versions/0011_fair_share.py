"""fair share of starts: org weights, and the org and place of each unsent start

capacity_orgs.weight is an org's share of the fleet's start rate (default 1). Each outbox
row carries its run's org and place (the run's admission time, kept across deferrals), and
a partial index on (org_id, place) over unsent rows lets the fair relay read each org's
head of line without walking the whole backlog.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-11 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import models

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('capacity_orgs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('weight', sa.Integer(), server_default='1',
                                      nullable=False))
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.add_column(sa.Column('org_id', sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column('place', models.base.UTCDateTime(timezone=True),
                                      nullable=True))
        batch_op.create_index('ix_outbox_fair', ['org_id', 'place'], unique=False,
                              postgresql_where=sa.text('sent_at IS NULL'),
                              sqlite_where=sa.text('sent_at IS NULL'))
    # Unsent rows written before this revision: their run's org and admission time.
    op.execute("UPDATE outbox SET org_id = (SELECT runs.org_id FROM runs WHERE "
               "runs.id = outbox.run_id), place = (SELECT runs.created_at FROM runs "
               "WHERE runs.id = outbox.run_id) WHERE sent_at IS NULL")


def downgrade() -> None:
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.drop_index('ix_outbox_fair', postgresql_where=sa.text('sent_at IS NULL'),
                            sqlite_where=sa.text('sent_at IS NULL'))
        batch_op.drop_column('place')
        batch_op.drop_column('org_id')
    with op.batch_alter_table('capacity_orgs', schema=None) as batch_op:
        batch_op.drop_column('weight')
