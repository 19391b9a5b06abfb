"""sheets: runtime sheets, their rows and write intents

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 10:29:20.428891
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import models


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('sheets',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('org_id', sa.String(length=128), nullable=False),
    sa.Column('play', sa.String(length=256), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('last_version', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('created_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.CheckConstraint('last_version >= 0', name=op.f('ck_sheets_last_version_nonnegative')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sheets')),
    sa.UniqueConstraint('org_id', 'play', 'name', name='uq_sheets_org_play_name')
    )
    op.create_table('sheet_rows',
    sa.Column('sheet_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('key', sa.String(length=1024).with_variant(sa.String(length=1024, collation='C'), 'postgresql'), nullable=False),
    sa.Column('data', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('result', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('write_version', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.CheckConstraint("status IN ('pending', 'done', 'failed')", name=op.f('ck_sheet_rows_status_known')),
    sa.CheckConstraint('write_version > 0', name=op.f('ck_sheet_rows_write_version_positive')),
    sa.ForeignKeyConstraint(['sheet_id'], ['sheets.id'], name=op.f('fk_sheet_rows_sheet_id_sheets'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('sheet_id', 'key', name=op.f('pk_sheet_rows'))
    )
    op.create_table('sheet_write_intents',
    sa.Column('sheet_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('version', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('run_id', sa.String(length=32), nullable=False),
    sa.Column('generation', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('intent_key', sa.String(length=64), nullable=True),
    sa.Column('created_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.CheckConstraint('version > 0', name=op.f('ck_sheet_write_intents_version_positive')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_sheet_write_intents_run_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['sheet_id'], ['sheets.id'], name=op.f('fk_sheet_write_intents_sheet_id_sheets'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('sheet_id', 'version', name=op.f('pk_sheet_write_intents')),
    sa.UniqueConstraint('sheet_id', 'intent_key', name='uq_sheet_write_intents_key')
    )
    with op.batch_alter_table('sheet_write_intents', schema=None) as batch_op:
        batch_op.create_index('ix_sheet_write_intents_run', ['run_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('sheet_write_intents', schema=None) as batch_op:
        batch_op.drop_index('ix_sheet_write_intents_run')

    op.drop_table('sheet_write_intents')
    op.drop_table('sheet_rows')
    op.drop_table('sheets')
