"""Alembic owns the schema: one head, models match migrations, and a clean round trip."""

from __future__ import annotations

import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from models import Base
from tasks.errors import SchemaNotCurrentError
from tasks.store import db
from tests.support.session import pg_database, psql


@pytest.fixture
def empty_pg() -> Iterator[str]:
    name = f"playrun_mig_{secrets.token_hex(4)}"
    psql(f'CREATE DATABASE "{name}"')
    yield pg_database(name)
    db.dispose_engines()
    psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'playrun.db'}"


def test_single_head_and_it_is_the_revision_the_code_needs() -> None:
    script = ScriptDirectory.from_config(db.alembic_config("sqlite://"))
    assert script.get_heads() == [db.head_revision()]


def test_importing_tasks_does_not_import_alembic() -> None:
    """Workers and the gateway check the revision with a SELECT and start faster."""
    code = "import sys, tasks, tasks.gateway.serve; print('alembic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def _diff(url: str) -> list[object]:
    with db.get_engine(url).connect() as conn:
        return list(compare_metadata(MigrationContext.configure(conn), Base.metadata))


def _named(diff: list[object]) -> set[tuple[str, str]]:
    """(operation, column or index name) of each difference."""
    return {(d[0], d[3].name if d[0] == "add_column" else d[1].name)  # type: ignore[index, attr-defined]
            for d in diff}


# What 0013 adds: the indexes retention walks, oldest first.
RETENTION_0013 = {("add_index", "ix_runs_finished_id"), ("add_index", "ix_work_receipts_released")}

# What 0012 adds: the warm pools and their members.
POOLS_0012 = {("add_table", "warm_pools"), ("add_table", "pool_members"),
              ("add_index", "ix_pool_members_ready"), ("add_index", "ix_pool_members_state")}

# What 0011 adds for the fair order of starts.
FAIR_0011 = {("add_column", "weight"), ("add_column", "org_id"), ("add_column", "place"),
             ("add_index", "ix_outbox_fair"), *RETENTION_0013}


@pytest.mark.parametrize("which", ["empty_pg", "empty_sqlite"])
def test_upgrade_check_downgrade_round_trip(which: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(which)
    db.upgrade(url)
    assert db.current_revision(url) == db.head_revision()
    assert _diff(url) == []  # what `alembic check` checks: models == migrations
    db.require_current_schema(url)
    db.downgrade(url, "base")
    assert db.current_revision(url) is None
    tables = set(sa.inspect(db.get_engine(url)).get_table_names()) - {"alembic_version"}
    assert tables == set()
    db.upgrade(url)
    assert _diff(url) == []


def test_an_unmigrated_database_is_refused_with_the_upgrade_command(empty_pg: str) -> None:
    with pytest.raises(SchemaNotCurrentError, match="playrun db upgrade") as err:
        db.require_current_schema(empty_pg)
    assert err.value.code == "SCHEMA_NOT_CURRENT"


SCALE_INDEXES = {
    "attempts": {"ix_attempts_active_expiry"},
    "capacity_leases": {"ix_capacity_leases_held", "ix_capacity_leases_reserved_expiry"},
    "outbox": {"ix_outbox_run_created", "ix_outbox_unsent_due"},
    "runs": {"ix_runs_queued_created"},
    "runtime_resources": {"ix_runtime_resources_undeleted"},
}


def _indexes(url: str) -> dict[str, set[str]]:
    db.dispose_engines()  # a fresh inspector: no cached reflection
    inspector = sa.inspect(db.get_engine(url))
    return {t: {str(ix["name"]) for ix in inspector.get_indexes(t)} & names
            for t, names in SCALE_INDEXES.items()}


@pytest.mark.parametrize("which", ["empty_pg", "empty_sqlite"])
def test_0006_adds_and_drops_the_scale_indexes(which: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(which)
    db.upgrade(url, "0005")
    assert _indexes(url) == {t: set() for t in SCALE_INDEXES}
    db.upgrade(url, "0006")
    assert _indexes(url) == SCALE_INDEXES
    # The indexes the models have beyond 0006 are exactly 0007's listing indexes, less
    # 0009's six, and 0011's fair index (the other revisions add tables and columns).
    assert {(d[0], d[1].name) for d in _diff(url)  # type: ignore[index, attr-defined]
            if isinstance(d, tuple) and str(d[0]).endswith("_index")} == {
        ("add_index", "ix_runs_created_id"), ("add_index", "ix_runs_org_created_id"),
        *(("remove_index", name) for names in UNWRITTEN.values() for name in names),
        ("add_index", "ix_outbox_fair"), *RETENTION_0013,
        *(op for op in POOLS_0012 if op[0] == "add_index")}
    db.downgrade(url, "0005")
    assert db.current_revision(url) == "0005"
    assert _indexes(url) == {t: set() for t in SCALE_INDEXES}


# Indexes no query needed, dropped by 0009: fewer to write per admission and status change.
UNWRITTEN = {"runs": {"ix_runs_org_id", "ix_runs_deferred_until"},
             "outbox": {"ix_outbox_run_id", "ix_outbox_sent_at"},
             "attempts": {"ix_attempts_lease_expires_at", "ix_attempts_state"}}


@pytest.mark.parametrize("which", ["empty_pg", "empty_sqlite"])
def test_0009_drops_the_unread_indexes_and_its_downgrade_restores_them(
        which: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(which)

    def present() -> dict[str, set[str]]:
        db.dispose_engines()
        inspector = sa.inspect(db.get_engine(url))
        return {t: {str(ix["name"]) for ix in inspector.get_indexes(t)} & names
                for t, names in UNWRITTEN.items()}

    db.upgrade(url, "0008")
    assert present() == UNWRITTEN
    db.upgrade(url, "0009")
    assert present() == {t: set() for t in UNWRITTEN}
    db.upgrade(url)
    assert _diff(url) == []
    db.downgrade(url, "0008")
    assert present() == UNWRITTEN


def test_0006_indexes_are_partial_on_postgres(empty_pg: str) -> None:
    db.upgrade(empty_pg, "0006")
    with db.get_engine(empty_pg).connect() as conn:
        defs: dict[str, str] = dict(conn.execute(sa.text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname LIKE 'ix_%'")).all())
    assert "WHERE (sent_at IS NULL)" in defs["ix_outbox_unsent_due"]
    assert "WHERE ((state)::text = 'reserved'::text)" in defs["ix_capacity_leases_reserved_expiry"]
    assert "WHERE ((state)::text <> 'deleted'::text)" in defs["ix_runtime_resources_undeleted"]


@pytest.mark.parametrize("which", ["empty_pg", "empty_sqlite"])
def test_0011_adds_weights_and_each_unsent_start_s_org_and_place(
        which: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(which)
    db.upgrade(url, "0010")
    with db.get_engine(url).begin() as conn:  # a run queued before the upgrade
        conn.execute(sa.text(
            "INSERT INTO play_bundles (digest, source, size) VALUES ('d', 's', 1)"))
        conn.execute(sa.text(
            "INSERT INTO runs (id, org_id, play_path, play_digest, input, status, "
            "current_generation, deferral_count, deferral_total_ms) VALUES "
            "('r1', 'acme', 'p.py', 'd', 'null', 'queued', 0, 0, 0)"))
        conn.execute(sa.text(
            "INSERT INTO outbox (id, run_id, task_name, args, publish_count) "
            "VALUES ('o1', 'r1', 'playrun.start_attempt', '[\"r1\"]', 0)"))
    db.upgrade(url, "0011")
    assert _named(_diff(url)) == RETENTION_0013 | POOLS_0012
    with db.get_engine(url).connect() as conn:
        org, place = conn.execute(sa.text(
            "SELECT org_id, place FROM outbox WHERE id = 'o1'")).one()
    assert org == "acme" and place is not None  # the fair relay can find it
    db.downgrade(url, "0010")
    assert _named(_diff(url)) == FAIR_0011 | RETENTION_0013 | POOLS_0012


@pytest.mark.parametrize("which", ["empty_pg", "empty_sqlite"])
def test_0012_adds_the_warm_pool_tables_and_its_downgrade_drops_them(
        which: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(which)
    db.upgrade(url, "0012")
    assert _named(_diff(url)) == RETENTION_0013
    with db.get_engine(url).begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO warm_pools (name, provider, min_ready, max_ready, ttl_s) "
            "VALUES ('default', 'local', 1, 2, 60)"))
        conn.execute(sa.text(
            "INSERT INTO pool_members (id, pool, provider, state) "
            "VALUES ('m1', 'default', 'local', 'creating')"))
        host = conn.scalar(sa.text("SELECT host FROM pool_members WHERE id = 'm1'"))
    assert host == ""  # a member of a provider any worker reaches
    db.downgrade(url, "0011")
    assert _named(_diff(url)) == RETENTION_0013 | POOLS_0012


@pytest.mark.parametrize("which", ["empty_pg", "empty_sqlite"])
def test_0013_keeps_every_id_and_adds_the_retention_indexes(
        which: str, request: pytest.FixtureRequest) -> None:
    from models import new_id
    from tasks.parse.checks import check_run_id

    url = request.getfixturevalue(which)
    db.upgrade(url, "0011")
    old = uuid.uuid4().hex  # the ids made before 0013: random (v4) hex
    with db.get_engine(url).begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO play_bundles (digest, source, size) VALUES ('d', 's', 1)"))
        conn.execute(sa.text(
            "INSERT INTO runs (id, org_id, play_path, play_digest, input, status, "
            "current_generation, deferral_count, deferral_total_ms) VALUES "
            "(:id, 'acme', 'p.py', 'd', 'null', 'succeeded', 0, 0, 0)"), {"id": old})
    db.upgrade(url, "0013")
    assert _diff(url) == []
    new = new_id()
    with db.get_engine(url).begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO runs (id, org_id, play_path, play_digest, input, status, "
            "current_generation, deferral_count, deferral_total_ms) VALUES "
            "(:id, 'acme', 'p.py', 'd', 'null', 'queued', 0, 0, 0)"), {"id": new})
        ids = set(conn.scalars(sa.text("SELECT id FROM runs")))
    assert ids == {old, new} and all(check_run_id(i) == i for i in ids)
    db.downgrade(url, "0012")
    assert _named(_diff(url)) == RETENTION_0013
