"""Foundation: bundles, runs, attempts, sandboxes, ledger, outbox, capacity, traffic policy.

Revision ID: 0001
Revises:
Create Date: 2026-12-01 04:15:15.031917
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import models

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('capacity_orgs',
    sa.Column('org_id', sa.String(length=128), nullable=False),
    sa.Column('limit', sa.Integer(), nullable=True),
    sa.Column('updated_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.PrimaryKeyConstraint('org_id', name=op.f('pk_capacity_orgs'))
    )
    op.create_table('play_bundles',
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.Column('created_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.PrimaryKeyConstraint('digest', name=op.f('pk_play_bundles'))
    )
    op.create_table('traffic_policies',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('mode', sa.String(length=32), nullable=False),
    sa.Column('starts_per_minute', sa.Float(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('created_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.Column('expires_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_traffic_policies'))
    )
    with op.batch_alter_table('traffic_policies', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_traffic_policies_expires_at'), ['expires_at'], unique=False)

    op.create_table('runs',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('org_id', sa.String(length=128), nullable=False),
    sa.Column('play_path', sa.String(length=1024), nullable=False),
    sa.Column('play_digest', sa.String(length=64), nullable=False),
    sa.Column('idempotency_key', sa.String(length=256), nullable=True),
    sa.Column('input', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('code', sa.String(length=64), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('output', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('current_generation', sa.Integer(), nullable=False),
    sa.Column('cancel_requested_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.Column('deferral_count', sa.Integer(), nullable=False),
    sa.Column('deferral_total_ms', sa.BigInteger(), nullable=False),
    sa.Column('deferred_until', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.Column('last_deferral_cause', sa.String(length=64), nullable=True),
    sa.Column('created_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.Column('updated_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.Column('finished_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['play_digest'], ['play_bundles.digest'], name=op.f('fk_runs_play_digest_play_bundles')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('org_id', 'idempotency_key', name='uq_runs_org_idem')
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_deferred_until'), ['deferred_until'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_org_id'), ['org_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_status'), ['status'], unique=False)

    op.create_table('attempts',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('run_id', sa.String(length=32), nullable=False),
    sa.Column('generation', sa.Integer(), nullable=False),
    sa.Column('lease_token', sa.String(length=64), nullable=False),
    sa.Column('lease_expires_at', models.base.UTCDateTime(timezone=True), nullable=False),
    sa.Column('worker_id', sa.String(length=256), nullable=True),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('provider', sa.String(length=64), nullable=True),
    sa.Column('sandbox_id', sa.String(length=256), nullable=True),
    sa.Column('runner_started_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.Column('runner_deadline', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.Column('events_offset', sa.BigInteger(), nullable=False),
    sa.Column('end_reason', sa.String(length=64), nullable=True),
    sa.Column('started_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.Column('ended_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_attempts_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_attempts')),
    sa.UniqueConstraint('run_id', 'generation', name='uq_attempts_run_gen')
    )
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_attempts_lease_expires_at'), ['lease_expires_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_attempts_state'), ['state'], unique=False)

    op.create_table('capacity_leases',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('org_id', sa.String(length=128), nullable=False),
    sa.Column('run_id', sa.String(length=32), nullable=False),
    sa.Column('generation', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('provider', sa.String(length=64), nullable=True),
    sa.Column('sandbox_id', sa.String(length=256), nullable=True),
    sa.Column('overrun', sa.Boolean(), nullable=False),
    sa.Column('reserved_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.Column('expires_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.Column('live_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.Column('released_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_capacity_leases_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_capacity_leases'))
    )
    with op.batch_alter_table('capacity_leases', schema=None) as batch_op:
        batch_op.create_index('ix_capacity_leases_attempt', ['run_id', 'generation'], unique=False)
        batch_op.create_index('ix_capacity_leases_org_state', ['org_id', 'state'], unique=False)

    op.create_table('outbox',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('run_id', sa.String(length=32), nullable=False),
    sa.Column('task_name', sa.String(length=128), nullable=False),
    sa.Column('args', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.Column('available_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.Column('sent_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.Column('publish_count', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_outbox_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_outbox'))
    )
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_outbox_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_outbox_sent_at'), ['sent_at'], unique=False)

    op.create_table('run_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=32), nullable=False),
    sa.Column('generation', sa.Integer(), nullable=True),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('data', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_run_events_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_run_events'))
    )
    with op.batch_alter_table('run_events', schema=None) as batch_op:
        batch_op.create_index('ix_run_events_run_seq', ['run_id', 'id'], unique=False)

    op.create_table('runtime_resources',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('run_id', sa.String(length=32), nullable=False),
    sa.Column('generation', sa.Integer(), nullable=False),
    sa.Column('provider', sa.String(length=64), nullable=False),
    sa.Column('sandbox_id', sa.String(length=256), nullable=False),
    sa.Column('labels', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.Column('updated_at', models.base.UTCDateTime(timezone=True), server_default=models.db_now(), nullable=False),
    sa.Column('deleted_at', models.base.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_runtime_resources_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runtime_resources')),
    sa.UniqueConstraint('provider', 'sandbox_id', name='uq_resources_sandbox')
    )
    with op.batch_alter_table('runtime_resources', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runtime_resources_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_runtime_resources_state'), ['state'], unique=False)




def downgrade() -> None:

    with op.batch_alter_table('runtime_resources', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runtime_resources_state'))
        batch_op.drop_index(batch_op.f('ix_runtime_resources_run_id'))

    op.drop_table('runtime_resources')
    with op.batch_alter_table('run_events', schema=None) as batch_op:
        batch_op.drop_index('ix_run_events_run_seq')

    op.drop_table('run_events')
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_outbox_sent_at'))
        batch_op.drop_index(batch_op.f('ix_outbox_run_id'))

    op.drop_table('outbox')
    with op.batch_alter_table('capacity_leases', schema=None) as batch_op:
        batch_op.drop_index('ix_capacity_leases_org_state')
        batch_op.drop_index('ix_capacity_leases_attempt')

    op.drop_table('capacity_leases')
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_attempts_state'))
        batch_op.drop_index(batch_op.f('ix_attempts_lease_expires_at'))

    op.drop_table('attempts')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_status'))
        batch_op.drop_index(batch_op.f('ix_runs_org_id'))
        batch_op.drop_index(batch_op.f('ix_runs_deferred_until'))

    op.drop_table('runs')
    with op.batch_alter_table('traffic_policies', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_traffic_policies_expires_at'))

    op.drop_table('traffic_policies')
    op.drop_table('play_bundles')
    op.drop_table('capacity_orgs')

