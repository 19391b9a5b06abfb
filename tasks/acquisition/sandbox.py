"""Provider create and the fenced record of the sandbox it gave us.

Labels name the run, generation, org and capacity lease, so GC can always find
an owner (or prove there is none) for any sandbox the provider lists.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from models import Attempt, Run, RunEvent, RuntimeResource, db_now, new_id
from tasks import protocol
from tasks.acquisition.claim import Claimed
from tasks.constants import (
    INPUT_FILE,
    LABEL_FLEET,
    LABEL_GENERATION,
    LABEL_LEASE,
    LABEL_MANAGED,
    LABEL_ORG,
    LABEL_RUN,
    PLAY_FILE,
    EventKind,
    SandboxState,
)
from tasks.errors import FenceLostError
from tasks.sandbox import ProviderError, SandboxProvider, SandboxRef, SandboxSpec
from tasks.sandbox.runtime import host_queue
from tasks.settings import Settings, get_settings
from tasks.store import ledger
from tasks.store.db import is_postgres, session_scope
from tasks.store.fence import Fence, append_if_current, hold, renew

log = logging.getLogger("playrun.acquisition")

# A provider-side lifetime outlasts the run's time limit by the runner's last push.
LIFETIME_GRACE_S = 300.0


# The runner's files: host source (under tasks/) -> its name in the sandbox, where they
# sit flat beside each other and import each other by these names.
RUNNER_SOURCES = {
    "execution/runner.py": protocol.RUNNER_FILE,
    "execution/runner_context.py": protocol.RUNNER_CONTEXT_FILE,
    "execution/runner_client.py": protocol.RUNNER_CLIENT_FILE,
    "execution/runner_http.py": protocol.RUNNER_HTTP_FILE,
    "execution/runner_steps.py": protocol.RUNNER_STEPS_FILE,
    "execution/runner_sheets.py": protocol.RUNNER_SHEETS_FILE,
    "execution/runner_sheetrows.py": protocol.RUNNER_SHEETROWS_FILE,
    "protocol.py": protocol.PROTOCOL_FILE,
    "execution/runner_standby.py": protocol.RUNNER_STANDBY_FILE,
}


@functools.cache  # read once per process: every sandbox gets the same bytes
def runner_source(path: str = "execution/runner.py") -> bytes:
    return resources.files("tasks").joinpath(path).read_bytes()


def runner_files() -> dict[str, bytes]:
    """Every file of the runner, by its name in the sandbox."""
    return {name: runner_source(path) for path, name in RUNNER_SOURCES.items()}


def labels_for(claimed: Claimed, lease_id: str | None,
               fleet: str = "default") -> dict[str, str]:
    labels = {
        LABEL_MANAGED: "1",
        LABEL_RUN: claimed.fence.run_id,
        LABEL_GENERATION: str(claimed.fence.generation),
        LABEL_ORG: claimed.org_id,
        LABEL_FLEET: fleet,
    }
    if lease_id:
        labels[LABEL_LEASE] = lease_id
    return labels


def sandbox_key(fence: Fence, earlier: int = 0) -> str:
    """A create retried after a lost answer (or a crash before its record) finds the same
    sandbox; `earlier` counts the attempt's recorded sandboxes, so a start tried again
    after its sandbox was released gets a new one."""
    suffix = f"-{earlier}" if earlier else ""
    return f"pr-{fence.run_id.lower()}-{fence.generation}{suffix}"[:63]


def recorded_sandboxes(fence: Fence) -> int:
    with session_scope(durable=False) as session:
        return int(session.scalar(sa.select(sa.func.count()).select_from(RuntimeResource).where(
            RuntimeResource.run_id == fence.run_id,
            RuntimeResource.generation == fence.generation)) or 0)


def egress_for(settings: Settings) -> tuple[str, ...] | None:
    if settings.sandbox_egress == "open" or not settings.gateway_public_url:
        return None
    host = urlsplit(settings.gateway_public_url).hostname
    return (host,) if host else None


def spec_for(claimed: Claimed, settings: Settings, lease_id: str | None,
             earlier: int = 0) -> SandboxSpec:
    return SandboxSpec(
        key=sandbox_key(claimed.fence, earlier),
        # The runner's own timeout, its supervisor's kill and a last flush come first.
        lifetime_s=settings.run_timeout_s + LIFETIME_GRACE_S,
        egress_hosts=egress_for(settings),
        labels=labels_for(claimed, lease_id, settings.fleet),
        files={
            PLAY_FILE: claimed.play_source.encode(),
            INPUT_FILE: json.dumps(claimed.input).encode(),
            **runner_files(),
        },
        memory_mb=settings.sandbox_memory_mb,
        max_file_mb=settings.sandbox_max_file_mb,
    )


def note_requested(fence: Fence, provider: str, ago_s: float = 0.0) -> None:
    """The permit is granted and the provider was asked `ago_s` before (not durable: see
    start.py). On PostgreSQL only a create that failed writes it here; a sandbox made
    has it written by its launch record, in the same statement (`requested`)."""
    data = {"provider": provider}
    if get_settings().is_postgres:
        if not append_if_current(fence, EventKind.SANDBOX_REQUESTED, data, ago_s):
            raise FenceLostError(f"attempt {fence.generation} of run {fence.run_id} is "
                                 f"not current")
        return
    with session_scope(durable=False) as session:
        hold(session, fence)
        ledger.append(session, fence.run_id, EventKind.SANDBOX_REQUESTED, data, fence.generation)


def requested(ref: SandboxRef) -> tuple[str, float] | None:
    """The `sandbox.requested` event a launch record still owes for REF: its data as JSON
    and how long ago the provider was asked; None when it was written already."""
    if ref.requested_at is None:
        return None
    return json.dumps({"provider": ref.provider}), max(0.0, time.monotonic() - ref.requested_at)


def record_live(fence: Fence, ref: SandboxRef, promote: Any = None) -> None:
    """Record the sandbox live (and promote its capacity lease) in its own transaction.

    If the fence is lost, the sandbox is recorded for cleanup in its own transaction (the
    caller's release deletes it) and FenceLostError propagates.
    """
    try:
        # Not durable: what follows it (the launch record) is, and flushes this first.
        with session_scope(durable=False) as session:
            record_live_in(session, fence, ref, promote)
            renew(session, fence, get_settings().lease_seconds)  # a slow create used some
    except FenceLostError:
        record_for_cleanup(fence, ref, "reported after the attempt lost its fence")
        raise


def record_live_in(session: Session, fence: Fence, ref: SandboxRef,
                   promote: Any = None, held: tuple[Run, Attempt] | None = None,
                   ) -> tuple[Run, Attempt]:
    """Inside the caller's transaction: hold the fence (unless the caller holds it: `held`),
    record the sandbox live and promote its capacity lease; returns the held rows. A second
    report of the same sandbox by the same intact attempt is idempotent success, proven
    from durable state. On FenceLostError the caller records the sandbox for cleanup
    (record_for_cleanup) once it rolled back."""
    held = held or hold(session, fence)
    if not _insert_live(session, fence, ref):
        # Already on record (the insert met the unique sandbox): success only for a
        # second report by this very attempt; anything else is a fence loss.
        known = session.scalars(sa.select(RuntimeResource).where(
            RuntimeResource.provider == ref.provider,
            RuntimeResource.sandbox_id == ref.sandbox_id)).first()
        if known is None or not (known.run_id == fence.run_id
                                 and known.generation == fence.generation
                                 and known.state == SandboxState.LIVE):
            raise FenceLostError(f"sandbox {ref.sandbox_id} is recorded "
                                 f"{'gone' if known is None else known.state} "
                                 "for another attempt")
        if promote is not None:
            promote(session, ref)  # proves the lease is live for this very sandbox
        return held
    attempt = held[1]
    attempt.provider = ref.provider
    attempt.sandbox_id = ref.sandbox_id
    attempt.host_queue = host_queue(ref.provider)
    if promote is not None:
        promote(session, ref)
    owed = requested(ref)
    if owed is not None:
        session.add(RunEvent(run_id=fence.run_id, generation=fence.generation,
                             kind=EventKind.SANDBOX_REQUESTED, data={"provider": ref.provider},
                             at=db_now(-owed[1])))  # added first: inserted first
    ledger.append(session, fence.run_id, EventKind.SANDBOX_LIVE,
                  {"sandbox_id": ref.sandbox_id, "provider": ref.provider},
                  fence.generation)
    return held


def _insert_live(session: Session, fence: Fence, ref: SandboxRef) -> bool:
    """Record the sandbox live unless it is on record already: one statement, where a
    lookup first would be two in the common case (a sandbox reported once)."""
    insert = pg_insert if is_postgres(session) else sqlite_insert
    stmt = insert(RuntimeResource).values(
        id=new_id(), run_id=fence.run_id, generation=fence.generation, provider=ref.provider,
        sandbox_id=ref.sandbox_id, labels=dict(ref.labels), state=SandboxState.LIVE,
        holder_token=fence.lease_token,
    ).on_conflict_do_nothing(index_elements=["provider", "sandbox_id"])
    return session.execute(stmt.returning(RuntimeResource.id)).first() is not None


def record_for_cleanup(fence: Fence, ref: SandboxRef, why: str) -> None:
    """Keep a durable record of a sandbox nobody will use, so GC deletes it if we cannot."""
    with session_scope() as session:
        if session.scalar(sa.select(RuntimeResource.id).where(
                RuntimeResource.provider == ref.provider,
                RuntimeResource.sandbox_id == ref.sandbox_id)) is not None:
            return  # already on record; GC judges it by its owner
        session.add(RuntimeResource(
            run_id=fence.run_id, generation=fence.generation, provider=ref.provider,
            sandbox_id=ref.sandbox_id, labels=dict(ref.labels), state=SandboxState.CLEANUP,
            holder_token=fence.lease_token, last_error=why, updated_at=db_now(),
        ))


def create(provider: SandboxProvider, claimed: Claimed, settings: Settings,
           lease_id: str | None) -> SandboxRef:
    """On PostgreSQL `sandbox.requested` costs no statement of its own: the launch record
    writes it, dated back to the ask, or, if the create fails, a statement after it. No
    fence check comes before the create: a stale attempt's sandbox is recorded for cleanup
    by its launch record (the fence decides there), as one made just before a fence loss."""
    postgres = settings.is_postgres
    if not postgres:
        note_requested(claimed.fence, provider.name)
    asked = time.monotonic()
    # Only a resumed attempt can have had a sandbox: a new generation skips the read.
    earlier = recorded_sandboxes(claimed.fence) if claimed.resumed else 0
    try:
        ref = provider.create(spec_for(claimed, settings, lease_id, earlier))
    except ProviderError:
        if postgres:
            note_requested(claimed.fence, provider.name, time.monotonic() - asked)
        raise
    return dataclasses.replace(ref, requested_at=asked) if postgres else ref
