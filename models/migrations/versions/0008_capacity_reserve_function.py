"""capacity reserve in one statement: a function that locks the org row, then counts

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 22:05:00

A reservation must count held leases after it holds the org's row lock, or a lease
committed while it waited is missed. In READ COMMITTED each statement of a VOLATILE
function takes a fresh snapshot, so lock, count and insert run in order inside one call:
one round trip instead of two. PostgreSQL only; SQLite serialises writers anyway.
"""

from __future__ import annotations

from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

# OUT used: leases held before this one; lease_id: NULL when none was taken (full, in
# enforce mode); cap: the limit that applied (the org's override, else p_default).
_CREATE = """
CREATE FUNCTION playrun_capacity_reserve(
    p_org varchar, p_id varchar, p_run varchar, p_gen integer, p_token varchar,
    p_default integer, p_observe boolean, p_ttl_s double precision,
    OUT used bigint, OUT lease_id varchar, OUT cap integer)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO capacity_orgs AS o (org_id) VALUES (p_org)
    ON CONFLICT (org_id) DO UPDATE SET org_id = excluded.org_id
    RETURNING coalesce(o."limit", p_default) INTO cap;
    SELECT count(*) INTO used FROM capacity_leases
    WHERE org_id = p_org AND state IN ('reserved', 'live');
    IF used < cap OR p_observe THEN
        INSERT INTO capacity_leases (id, org_id, run_id, generation, state, holder_token,
                                     overrun, expires_at)
        VALUES (p_id, p_org, p_run, p_gen, 'reserved', p_token, used >= cap,
                clock_timestamp() + make_interval(secs => p_ttl_s));
        lease_id := p_id;
    END IF;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(_CREATE)


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute('DROP FUNCTION IF EXISTS playrun_capacity_reserve')
