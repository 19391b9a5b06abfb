"""`playrun pool set|show|remove` as an operator uses it, what beat's pass does with the
bounds it sets, and what garbage collection makes of warm sandboxes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from models import PoolMember, db_now
from tasks.acquisition.pools import claim as pool_claim
from tasks.acquisition.pools import config, hygiene
from tasks.admission import placement
from tasks.constants import LABEL_MANAGED, LABEL_MEMBER, LABEL_POOL, PoolMemberState
from tasks.maintenance.gc import verdict
from tasks.sandbox import SandboxRef
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tests.support.paths import ROOT
from tests.support.stack import worker_env


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tasks.cli.main", "pool", *args],
                          env={**worker_env(), "COLUMNS": "200"}, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(autouse=True)
def clean(pg_url: str) -> Iterator[None]:
    yield
    with session_scope() as session:
        session.execute(sa.delete(PoolMember))
    for pool in config.pools():
        config.remove_pool(pool.name)


def add_members(pool: str, n: int, state: str = PoolMemberState.READY, *,
                expires_in_s: float = 600.0, seen_ago_s: float = 0.0) -> list[str]:
    ids = []
    with session_scope() as session:
        for _ in range(n):
            member = PoolMember(pool=pool, provider="local", host=pool_claim.host_of("local"),
                                sandbox_id=f"warm-{uuid.uuid4().hex[:12]}", state=state,
                                ready_at=db_now(), seen_at=db_now(-seen_ago_s),
                                expires_at=db_now(expires_in_s))
            session.add(member)
            session.flush()
            ids.append(member.id)
    return ids


def states(pool: str) -> list[str]:
    with session_scope(readonly=True) as session:
        return sorted(session.scalars(sa.select(PoolMember.state)
                                      .where(PoolMember.pool == pool)).all())


def test_set_show_and_remove_a_pool() -> None:
    done = cli("set", "default", "--min", "2", "--max", "5", "--ttl", "15m", "--provider", "local")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"name": "default", "provider": "local", "min_ready": 2,
                                       "max_ready": 5, "ttl_s": 900.0}
    add_members("default", 2)
    shown = json.loads(cli("show", "--json").stdout)["pools"]
    assert [(p["name"], p["ready"], p["min_ready"], p["max_ready"]) for p in shown] == [
        ("default", 2, 2, 5)]
    table = cli("show").stdout
    assert "default" in table and "READY" in table
    removed = cli("remove", "default")
    assert json.loads(removed.stdout) == {"removed": "default", "retired": 2}
    assert states("default") == ["retiring", "retiring"]
    assert "no pools" in cli("show").stdout


@pytest.mark.parametrize(("args", "code"), [
    (("--min", "5", "--max", "2"), "POOL_INVALID"),
    (("--min", "-1", "--max", "2"), "POOL_INVALID"),
    (("--min", "1", "--max", "100000"), "POOL_INVALID"),
    (("--min", "1", "--max", "2", "--ttl", "banana"), "DURATION_INVALID"),
    (("--min", "1", "--max", "2", "--ttl", "2s"), "POOL_INVALID"),
    (("--min", "1", "--max", "2", "--ttl", "3d"), "POOL_INVALID"),
    (("--min", "1", "--max", "2", "--provider", "nimbus"), "POOL_INVALID"),
])
def test_bad_bounds_are_refused_with_a_code_and_nothing_stored(args: tuple[str, ...],
                                                                code: str) -> None:
    refused = cli("set", "default", *args)
    assert refused.returncode != 0
    assert code in refused.stderr + refused.stdout
    assert config.pools() == []


def test_a_pool_names_an_existing_policy_and_takes_its_provider() -> None:
    refused = cli("set", "nosuch", "--min", "1", "--max", "2")
    assert refused.returncode != 0 and "PLACEMENT_UNKNOWN" in refused.stderr + refused.stdout
    assert "POOL_INVALID" in (lambda r: r.stderr + r.stdout)(
        cli("set", "Bad Name", "--min", "1", "--max", "2"))
    assert "POOL_UNKNOWN" in (lambda r: r.stderr + r.stdout)(cli("remove", "ghost"))
    placement.set_policy(placement.build("fast", "fake"), check_served=False)
    try:
        done = cli("set", "fast", "--min", "1", "--max", "2")
        assert json.loads(done.stdout)["provider"] == "fake"
        other = cli("set", "fast", "--min", "1", "--max", "2", "--provider", "local")
        assert "POOL_INVALID" in other.stderr + other.stdout
    finally:
        config.remove_pool("fast")
        with session_scope() as session:
            session.execute(sa.text("DELETE FROM placement_policies WHERE name = 'fast'"))


def test_beat_retires_expired_silent_surplus_and_orphaned_members() -> None:
    config.set_pool(config.build("default", 0, 3, "10m", "local"))
    fresh = add_members("default", 4)
    add_members("default", 1, expires_in_s=-1)
    add_members("default", 1, seen_ago_s=3600)
    add_members("gone", 2)  # a pool that no longer exists
    report = hygiene.tick(get_settings())
    assert report.retired == {"expired": 1, "silent": 1, "pool removed": 2, "surplus": 1}
    with session_scope(readonly=True) as session:
        left = set(session.scalars(sa.select(PoolMember.id).where(
            PoolMember.state == PoolMemberState.READY)).all())
    assert len(left) == 3 and left < set(fresh)  # the oldest of the four went
    assert ("default", "local", pool_claim.host_of("local")) in report.refills


def test_gc_keeps_a_ready_warm_sandbox_and_deletes_a_retired_or_unknown_one() -> None:
    config.set_pool(config.build("default", 0, 3, "10m", "local"))
    (ready,) = add_members("default", 1)
    (retired,) = add_members("default", 1, PoolMemberState.RETIRING)

    def ref(member: str) -> SandboxRef:
        return SandboxRef("local", "x", {LABEL_MANAGED: "1", LABEL_POOL: "default",
                                         LABEL_MEMBER: member}, 0.0)
    assert verdict(ref(ready)) is None
    assert verdict(ref(retired)) == "pool member is retiring"
    assert verdict(ref("nobody")) == "no owner: no such pool member"


def test_beat_retires_the_members_of_the_last_removed_pool() -> None:
    assert hygiene.tick(get_settings()).retired == {}  # no pool, no member: nothing to do
    add_members("gone", 2)  # its pool was the last one
    report = hygiene.tick(get_settings())
    assert report.retired == {"pool removed": 2}
    assert states("gone") == ["retiring", "retiring"]
