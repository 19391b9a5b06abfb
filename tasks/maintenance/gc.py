"""Sandbox GC (docs/design.md): delete listed sandboxes that nothing current owns.

A sandbox is kept only while it is recorded live for the current, active attempt
of a non-terminal run, or is younger than the grace period (it may be between
the provider's create and our record of it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import sqlalchemy as sa

from models import Attempt, PoolMember, Run, RuntimeResource, db_now
from tasks.constants import (
    LABEL_FLEET,
    LABEL_GENERATION,
    LABEL_MANAGED,
    LABEL_MEMBER,
    LABEL_RUN,
    TERMINAL_STATUSES,
    AttemptState,
    EventKind,
    PoolMemberState,
    SandboxState,
)
from tasks.sandbox import SandboxProvider, SandboxRef
from tasks.store import ledger
from tasks.store.db import session_scope
from tasks.store.fence import lock_run

log = logging.getLogger("playrun.gc")


@dataclass
class GcReport:
    listed: int = 0
    other_fleet: int = 0  # another fleet's: its own GC judges them
    kept: int = 0
    young: int = 0
    deleted: list[tuple[str, str, str]] = field(default_factory=list)  # provider, id, why
    failed: list[tuple[str, str, str]] = field(default_factory=list)


def _member(ref: SandboxRef) -> tuple[str | None, str | None, int | None]:
    """A warm sandbox's verdict from its pool member: (why it goes, or None with the run
    and generation that claimed it, which then own it as any attempt owns its sandbox)."""
    with session_scope(readonly=True) as session:
        member = session.get(PoolMember, ref.labels.get(LABEL_MEMBER, ""))
    if member is None:
        return "no owner: no such pool member", None, None
    if member.state in (PoolMemberState.CREATING, PoolMemberState.READY):
        return None, None, None  # the pool keeps it; hygiene retires it when due
    if member.state != PoolMemberState.CLAIMED or member.run_id is None:
        return f"pool member is {member.state}", None, None
    return None, member.run_id, member.generation


def verdict(ref: SandboxRef) -> str | None:
    """Why this sandbox should go, or None to keep it."""
    run_id = ref.labels.get(LABEL_RUN)
    try:
        generation = int(ref.labels.get(LABEL_GENERATION, ""))
    except ValueError:
        if LABEL_MEMBER not in ref.labels:
            return "no owner: unreadable generation label"
        why, run_id, claimed = _member(ref)
        if why is not None or run_id is None or claimed is None:
            return why
        generation = claimed
    with session_scope() as session:
        run = session.get(Run, run_id) if run_id else None
        if run is None:
            return "no owner: no such run"
        if run.status in TERMINAL_STATUSES:
            return f"run is {run.status}"
        attempt = session.scalars(sa.select(Attempt).where(
            Attempt.run_id == run.id, Attempt.generation == generation)).first()
        if (attempt is None or attempt.state != AttemptState.ACTIVE
                or generation != run.current_generation):
            return "attempt is fenced out"
        record = session.scalars(sa.select(RuntimeResource).where(
            RuntimeResource.provider == ref.provider,
            RuntimeResource.sandbox_id == ref.sandbox_id)).first()
        if record is None:
            return "no record owns it"
        if record.state != SandboxState.LIVE:
            return f"recorded as {record.state}"
        return None


def _mark_deleted(provider: str, sandbox_id: str) -> None:
    """Mark the record deleted and say so in its run's ledger, as a release would."""
    with session_scope() as session:
        owner = session.scalar(sa.select(RuntimeResource.run_id).where(
            RuntimeResource.provider == provider, RuntimeResource.sandbox_id == sandbox_id))
        if owner is None:
            return
        lock_run(session, owner)  # run row first, as every writer does: no deadlock
        rows = session.execute(sa.update(RuntimeResource).where(
            RuntimeResource.provider == provider, RuntimeResource.sandbox_id == sandbox_id,
            RuntimeResource.state != SandboxState.DELETED,
        ).values(state=SandboxState.DELETED, deleted_at=db_now(), updated_at=db_now())
            .returning(RuntimeResource.run_id, RuntimeResource.generation)).all()
        for run_id, generation in rows:
            ledger.append(session, run_id, EventKind.SANDBOX_DELETED,
                          {"sandbox_id": sandbox_id, "by": "gc"}, generation)


def collect(providers: list[SandboxProvider], grace_s: float, *,
            now: float | None = None, fleet: str | None = None) -> GcReport:
    """One pass; with `fleet`, another fleet's sandboxes on a shared account are left be
    (a sandbox without a fleet label predates them and is judged here)."""
    report = GcReport()
    now = time.time() if now is None else now
    for provider in providers:
        for ref in provider.list({LABEL_MANAGED: "1"}):
            report.listed += 1
            if fleet is not None and ref.labels.get(LABEL_FLEET, fleet) != fleet:
                report.other_fleet += 1
                continue
            if now - ref.created_at < grace_s:
                report.young += 1
                continue
            why = verdict(ref)
            if why is None:
                report.kept += 1
                continue
            try:
                provider.delete(ref.sandbox_id)
            except Exception as exc:  # noqa: BLE001 - one bad sandbox must not stop the pass
                log.warning("gc could not delete %s: %s", ref.sandbox_id, exc)
                report.failed.append((provider.name, ref.sandbox_id, str(exc)))
                continue
            _mark_deleted(provider.name, ref.sandbox_id)
            log.info("gc deleted %s/%s: %s", provider.name, ref.sandbox_id, why)
            report.deleted.append((provider.name, ref.sandbox_id, why))
    return report
