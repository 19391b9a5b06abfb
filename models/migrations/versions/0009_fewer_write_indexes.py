"""fewer indexes to write: drop six that no query needs (two are prefixes of others)

Every admission wrote 15 index entries, and every change to an indexed column of a run or
an attempt (status, a lease renewal) rewrote all of its table's; these six served no
query: runs.org_id and outbox.run_id lead other indexes (uq_runs_org_idem,
ix_outbox_run_created), nothing filters on runs.deferred_until (deferred starts wait in
the outbox: ix_outbox_unsent_due) or outbox.sent_at (the resend walks queued runs:
ix_runs_queued_created), and attempts are found by run (uq_attempts_run_gen) or, active
and expiring, by the partial ix_attempts_active_expiry, never by state or expiry alone.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 02:05:00
"""

from __future__ import annotations

from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

_DROPPED = (("runs", "ix_runs_org_id", "org_id"),
            ("runs", "ix_runs_deferred_until", "deferred_until"),
            ("outbox", "ix_outbox_run_id", "run_id"),
            ("outbox", "ix_outbox_sent_at", "sent_at"),
            ("attempts", "ix_attempts_lease_expires_at", "lease_expires_at"),
            ("attempts", "ix_attempts_state", "state"))


def upgrade() -> None:
    for table, name, _column in _DROPPED:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_index(name)


def downgrade() -> None:
    for table, name, column in _DROPPED:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.create_index(name, [column], unique=False)
