"""time-ordered ids and retention: the indexes the retention pass walks, oldest first

Ids keep their columns and format: new rows of runs, attempts, capacity leases and
sandboxes get UUIDv7 hex (32 lower-case hex digits, as the v4 ids before them) and outbox
rows a dashed UUIDv7 (36 characters, as before), made where the row is written
(models/ids.py); every existing id stays as it is and still parses everywhere. The ledger
(run_events) keeps its bigint identity, already in insertion order. Nothing is rewritten.

Retention (tasks/maintenance/retention.py) deletes ended runs oldest first by
(finished_at, id), and released receipts by released_at: two partial indexes hold only
those rows, so a batch reads the head of one index whatever the table's size.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

_FINISHED = "finished_at IS NOT NULL"
_RELEASED = "status = 'released'"


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index('ix_runs_finished_id', ['finished_at', 'id'], unique=False,
                              postgresql_where=sa.text(_FINISHED),
                              sqlite_where=sa.text(_FINISHED))
    with op.batch_alter_table('work_receipts', schema=None) as batch_op:
        batch_op.create_index('ix_work_receipts_released', ['released_at'], unique=False,
                              postgresql_where=sa.text(_RELEASED),
                              sqlite_where=sa.text(_RELEASED))


def downgrade() -> None:
    with op.batch_alter_table('work_receipts', schema=None) as batch_op:
        batch_op.drop_index('ix_work_receipts_released')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index('ix_runs_finished_id')
