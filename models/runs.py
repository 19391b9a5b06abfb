"""Plays, runs, attempts, ledger events and the outbox."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, JSONType, UTCDateTime, db_now, new_id


class PlayBundle(Base):
    """A play's source, content-addressed by its SHA-256 digest."""

    __tablename__ = "play_bundles"
    digest: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    source: Mapped[str] = mapped_column(sa.Text)
    size: Mapped[int] = mapped_column(sa.Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        sa.UniqueConstraint("org_id", "idempotency_key", name="uq_runs_org_idem"),
        # Listings page newest first by (created_at, id), for all orgs or one.
        sa.Index("ix_runs_created_id", "created_at", "id"),
        sa.Index("ix_runs_org_created_id", "org_id", "created_at", "id"),
        # The resend of long-queued starts walks queued runs oldest first.
        sa.Index("ix_runs_queued_created", "created_at",
                 postgresql_where=sa.text("status = 'queued'"),
                 sqlite_where=sa.text("status = 'queued'")),
        # Retention deletes ended runs oldest first (tasks/maintenance/retention.py).
        sa.Index("ix_runs_finished_id", "finished_at", "id",
                 postgresql_where=sa.text("finished_at IS NOT NULL"),
                 sqlite_where=sa.text("finished_at IS NOT NULL")),
    )

    # UUIDv7 hex (models/ids.py); rows from before it keep their v4 hex ids.
    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True, default=new_id)
    org_id: Mapped[str] = mapped_column(sa.String(128))
    play_path: Mapped[str] = mapped_column(sa.String(1024))
    play_digest: Mapped[str] = mapped_column(sa.ForeignKey("play_bundles.digest"))
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(256))
    input: Mapped[Any] = mapped_column(JSONType, nullable=True)
    status: Mapped[str] = mapped_column(sa.String(16), index=True)
    code: Mapped[str | None] = mapped_column(sa.String(64))
    error: Mapped[str | None] = mapped_column(sa.Text)
    output: Mapped[Any] = mapped_column(JSONType, nullable=True)
    current_generation: Mapped[int] = mapped_column(sa.Integer, default=0)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Bounded deferral of pre-code failures (docs/contract.md).
    deferral_count: Mapped[int] = mapped_column(sa.Integer, default=0)
    deferral_total_ms: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    deferred_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_deferral_cause: Mapped[str | None] = mapped_column(sa.String(64))
    # The placement policy the run was admitted with (none: the worker's own provider).
    placement: Mapped[str | None] = mapped_column(sa.String(40))
    # Passes of maintenance that failed unexpectedly for this run; bounded (see trouble.py).
    trouble_count: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Attempt(Base):
    """One try at a run; only the current, unexpired (generation, lease_token) may write."""

    __tablename__ = "attempts"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "generation", name="uq_attempts_run_gen"),
        # The reaper's expired leases: only active attempts, however many have ended.
        sa.Index("ix_attempts_active_expiry", "lease_expires_at",
                 postgresql_where=sa.text("state = 'active'"),
                 sqlite_where=sa.text("state = 'active'")),
    )

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True, default=new_id)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    generation: Mapped[int] = mapped_column(sa.Integer)
    lease_token: Mapped[str] = mapped_column(sa.String(64))
    lease_expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    worker_id: Mapped[str | None] = mapped_column(sa.String(256))
    state: Mapped[str] = mapped_column(sa.String(16))
    provider: Mapped[str | None] = mapped_column(sa.String(64))
    # The provider placement chose for this attempt (kept across its deferrals).
    placed_provider: Mapped[str | None] = mapped_column(sa.String(64))
    sandbox_id: Mapped[str | None] = mapped_column(sa.String(256))
    # The detached runner's suspension: when it was launched and when it must be done.
    runner_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    runner_deadline: Mapped[datetime | None] = mapped_column(UTCDateTime)
    events_offset: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    # The launch the runner's token names: the runner's own fence at the gateway.
    launch_id: Mapped[str | None] = mapped_column(sa.String(32))
    # Celery queue of the host that owns a `local` sandbox (None: any worker reaches it).
    host_queue: Mapped[str | None] = mapped_column(sa.String(200))
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # When the gateway was last seen unreachable by an inspection that found it running.
    unreachable_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    progress_count: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    progress_dropped: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    end_reason: Mapped[str | None] = mapped_column(sa.String(64))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class EventDelivery(Base):
    """One keyed delivery of progress events; a repeated key writes nothing twice."""

    __tablename__ = "event_deliveries"

    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"),
                                        primary_key=True)
    idempotency_key: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    owner: Mapped[str] = mapped_column(sa.String(200))
    count: Mapped[int] = mapped_column(sa.Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())


class RunEvent(Base):
    """The append-only run ledger."""

    __tablename__ = "run_events"
    __table_args__ = (sa.Index("ix_run_events_run_seq", "run_id", "id"),)

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    generation: Mapped[int | None] = mapped_column(sa.Integer)
    kind: Mapped[str] = mapped_column(sa.String(64))
    data: Mapped[Any] = mapped_column(JSONType)
    at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())


class Outbox(Base):
    """Messages to publish after commit; the row id is the Celery task id."""

    __tablename__ = "outbox"
    __table_args__ = (
        # The sweep's due rows: only the unsent ones, however many were sent.
        sa.Index("ix_outbox_unsent_due", "available_at",
                 postgresql_where=sa.text("sent_at IS NULL"),
                 sqlite_where=sa.text("sent_at IS NULL")),
        # The newest row of a run (resend_stale).
        sa.Index("ix_outbox_run_created", "run_id", "created_at"),
        # The fair relay: each org's unsent rows in order of place.
        sa.Index("ix_outbox_fair", "org_id", "place",
                 postgresql_where=sa.text("sent_at IS NULL"),
                 sqlite_where=sa.text("sent_at IS NULL")),
    )

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    task_name: Mapped[str] = mapped_column(sa.String(128))
    args: Mapped[Any] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    available_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=db_now())
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    publish_count: Mapped[int] = mapped_column(sa.Integer, default=0)
    # The run's org and its place in that org's line (admission time, kept across
    # deferrals); NULL on rows written before fair share, which go out in FIFO order.
    org_id: Mapped[str | None] = mapped_column(sa.String(128))
    place: Mapped[datetime | None] = mapped_column(UTCDateTime)
