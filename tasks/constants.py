"""Every key prefix, code, status and default in one place."""

from __future__ import annotations

import enum
from typing import Final

# Codes, file names and limits shared with the runner in a sandbox: tasks/protocol.py.
from tasks import protocol

# States and kinds the database stores: each value is exactly the string in its column,
# so a StrEnum member compares equal to what SQL, Lua and older rows hold.


class RunStatus(enum.StrEnum):
    """runs.status (docs/contract.md)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES: Final = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})


class AttemptState(enum.StrEnum):
    """attempts.state."""

    ACTIVE = "active"
    ENDED = "ended"
    FENCED_OUT = "fenced_out"
    # Waiting out a pre-code deferral; resumed by the next claim without a new generation.
    DEFERRED = "deferred"


class LeaseState(enum.StrEnum):
    """capacity_leases.state: reserved -> live -> released (docs/design.md)."""

    RESERVED = "reserved"
    LIVE = "live"
    RELEASED = "released"


LEASE_HELD: Final = (LeaseState.RESERVED, LeaseState.LIVE)


class SandboxState(enum.StrEnum):
    """runtime_resources.state: a run's sandbox."""

    LIVE = "live"
    CLEANUP = "cleanup"
    DELETED = "deleted"


class ReceiptState(enum.StrEnum):
    """work_receipts.status (docs/contract.md); pending and running are held by their attempt."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    RELEASED = "released"


RECEIPT_HELD: Final = frozenset({ReceiptState.PENDING, ReceiptState.RUNNING})


class SheetRowStatus(enum.StrEnum):
    """sheet_rows.status (its CHECK constraint lists the same values)."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class IntentKind(enum.StrEnum):
    """sheet_write_intents.kind."""

    STABLE = "stable"  # one per (run, table), reused by every page and wake
    LEGACY = "legacy"  # minted by each legacy sheet_start without a version


class IntentStatus(enum.StrEnum):
    """sheet_write_intents.status."""

    ADMITTED = "admitted"


class PoolMemberState(enum.StrEnum):
    """pool_members.state: a warm sandbox's life (tasks/acquisition/pools/)."""

    CREATING = "creating"  # a refill is making it
    READY = "ready"  # its standby runner waits for an assignment
    CLAIMED = "claimed"  # handed to exactly one attempt, whose sandbox it now is
    RETIRING = "retiring"  # expired, surplus, silent or its pool removed: to delete
    GONE = "gone"  # deleted


class EventKind(enum.StrEnum):
    """run_events.kind: the ledger (docs/contract.md)."""

    ADMITTED = "run.admitted"
    ATTEMPT_STARTED = "attempt.started"
    DEFERRED = "run.deferred"
    PLACEMENT_CHOSEN = "placement.chosen"
    SANDBOX_REQUESTED = "sandbox.requested"
    SANDBOX_LIVE = "sandbox.live"
    PROGRESS = "run.progress"
    SANDBOX_DELETED = "sandbox.deleted"
    CAPACITY_RELEASED = "capacity.released"
    CAPACITY_OVERRUN = "capacity.overrun"
    RECEIPTS_RELEASED = "receipts.released"
    STEP_REUSED = "step.reused"
    STEP_COMPLETED = "step.completed"
    STEP_FAILED = "step.failed"
    STEP_TAKEN_OVER = "step.taken_over"
    CANCEL_REQUESTED = "run.cancel_requested"
    MAINTENANCE_FAILED = "run.maintenance_failed"
    PROGRESS_DROPPED = "run.progress_dropped"
    # An attempt spent a ledger budget: later rows of that group are not written.
    LEDGER_BUDGET_SPENT = "ledger.budget_spent"
    # The gateway refused an attempt's request past its rate or its hard budget.
    GATEWAY_REFUSED = "gateway.refused"
    POOL_CLAIMED = "pool.claimed"
    POOL_MISSED = "pool.missed"
    RUNNER_LOST = "runner.lost"
    RUNNER_UNREACHABLE = "runner.unreachable"
    SUCCEEDED = "run.succeeded"
    FAILED = "run.failed"
    CANCELLED = "run.cancelled"


# `gateway.refused` rows per attempt (each a code and a count), and how often one code's
# later refusals are gathered into a row; past the rows, refusals are only counted.
GATEWAY_REFUSED_MAX_EVENTS: Final = 20
GATEWAY_REFUSED_EVERY_S: Final = 5.0
GATEWAY_REFUSED_GROUP: Final = "gateway.refused"

# Ledger rows the step actions write, budgeted together per attempt (settings.step_max_events).
STEP_EVENTS: Final = (EventKind.STEP_REUSED, EventKind.STEP_COMPLETED, EventKind.STEP_FAILED,
                      EventKind.STEP_TAKEN_OVER)

TERMINAL_EVENT: Final = {
    RunStatus.SUCCEEDED: EventKind.SUCCEEDED,
    RunStatus.FAILED: EventKind.FAILED,
    RunStatus.CANCELLED: EventKind.CANCELLED,
}

# Stable failure codes (docs/contract.md).
PLAY_NOT_FOUND: Final = protocol.PLAY_NOT_FOUND
PLAY_INVALID: Final = protocol.PLAY_INVALID
PLAY_ERROR: Final = protocol.PLAY_ERROR
OUTPUT_INVALID: Final = protocol.OUTPUT_INVALID
INPUT_INVALID: Final = protocol.INPUT_INVALID
RUN_TIMEOUT: Final = protocol.RUN_TIMEOUT
SANDBOX_CAPACITY_EXCEEDED: Final = "SANDBOX_CAPACITY_EXCEEDED"
START_DEFERRAL_EXHAUSTED: Final = "START_DEFERRAL_EXHAUSTED"
RUNTIME_RUNNER_LOST: Final = "RUNTIME_RUNNER_LOST"
CANCELLED_CODE: Final = "CANCELLED"
SANDBOX_START_FAILED: Final = "SANDBOX_START_FAILED"
# The gateway failed the attempt for sustained refused requests (tasks/gateway/refusals.py).
GATEWAY_ABUSE: Final = protocol.GATEWAY_ABUSE
# Maintenance kept failing on this run (see tasks/maintenance/trouble.py).
RUNTIME_INTERNAL_ERROR: Final = "RUNTIME_INTERNAL_ERROR"
# Codes a run may fail with from ctx.step (tasks/execution/runner_steps.py).
STEP_CODES: Final = protocol.STEP_CODES
# Runtime sheets (docs/design.md): a writer superseded by a newer write version, and a gateway
# without the write-intent start.
RUNTIME_SHEET_ATTEMPT_SUPERSEDED: Final = protocol.RUNTIME_SHEET_ATTEMPT_SUPERSEDED
RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE: Final = protocol.RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE

CAPACITY_EXCEEDED_MESSAGE: Final = (
    "This organization's execution concurrency limit is currently full."
)

# Sandbox labels (provider-neutral; GC lists by these).
LABEL_MANAGED: Final = "playrun"
LABEL_RUN: Final = "playrun.run"
LABEL_GENERATION: Final = "playrun.generation"
LABEL_ORG: Final = "playrun.org"
LABEL_LEASE: Final = "playrun.lease"
LABEL_FLEET: Final = "playrun.fleet"
LABEL_POOL: Final = "playrun.pool"  # a warm sandbox's pool (no run label until claimed)
LABEL_MEMBER: Final = "playrun.member"

# Files a runner leaves in its sandbox.
RESULT_FILE: Final = protocol.RESULT_FILE
EVENTS_FILE: Final = protocol.EVENTS_FILE
PLAY_FILE: Final = protocol.PLAY_FILE
INPUT_FILE: Final = protocol.INPUT_FILE
RUNNER_FILE: Final = protocol.RUNNER_FILE
RUNNER_CLIENT_FILE: Final = protocol.RUNNER_CLIENT_FILE
RUNNER_STEPS_FILE: Final = protocol.RUNNER_STEPS_FILE
RUNNER_SHEETS_FILE: Final = protocol.RUNNER_SHEETS_FILE

# The Alembic revision this code needs; tests/integration/test_migrations.py checks it is the head.
SCHEMA_REVISION: Final = "0013"

# Celery queue and task names.
QUEUE: Final = "playrun"
# Beat's periodic jobs ride their own queue: a backlog of starts must not expire them.
MAINTENANCE_QUEUE: Final = "playrun.maintenance"
# Releases of sandboxes any worker reaches (fake, cloud): a backlog of starts must not hold
# capacity that finished runs already gave back. A `local` sandbox's go to its host's queue.
RELEASE_QUEUE: Final = "playrun.release"
# Every sandbox provider's name (the registry, tasks/sandbox/providers, has the details).
PROVIDER_NAMES: Final = ("local", "fake", "daytona", "e2b", "modal", "agentcore")
# Starts placed on a provider ride its own queue: only its workers take them.
PROVIDER_QUEUE_PREFIX: Final = "playrun.provider."
# PLAYRUN_BROKER_URL's schemes: Redis, or RabbitMQ (AMQP 0-9-1).
BROKER_SCHEMES: Final = ("redis", "rediss", "amqp", "amqps")
AMQP_SCHEMES: Final = ("amqp", "amqps")
# RabbitMQ queues are quorum queues: replicated, durable, and safe with a node restart.
AMQP_QUEUE_ARGUMENTS: Final = {"x-queue-type": "quorum"}
TASK_START_ATTEMPT: Final = "playrun.start_attempt"
TASK_SWEEP_OUTBOX: Final = "playrun.sweep_outbox"
TASK_REAP: Final = "playrun.reap"
TASK_SANDBOX_GC: Final = "playrun.sandbox_gc"
TASK_PRUNE_HISTORY: Final = "playrun.prune_history"
TASK_WATCHDOG_PING: Final = "playrun.watchdog_ping"
TASK_RELEASE_ATTEMPT: Final = "playrun.release_attempt"
# Several attempts' releases in one task: the gateway groups what settles within a window.
TASK_RELEASE_ATTEMPTS: Final = "playrun.release_attempts"
# One task releases its holders one after another: a cloud provider's slow deletes must
# not add up to the task time limit (240 s soft).
RELEASE_BATCH_MAX: Final = 20
RELEASE_BATCH_WINDOW_S: Final = 0.05  # a release waits at most this past the last send
MAX_LEASE_TOKEN_CHARS: Final = 64  # attempts.lease_token's column
# runtime_resources' id, provider and sandbox_id columns
SANDBOX_FIELD_CHARS: Final = (32, 64, 256)
TASK_INSPECT_ATTEMPT: Final = "playrun.inspect_attempt"
TASK_CANCEL_ATTEMPT: Final = "playrun.cancel_attempt"
TASK_POOL_TICK: Final = "playrun.pool_tick"  # beat: each pool's hygiene, then its refills
TASK_POOL_REFILL: Final = "playrun.pool_refill"  # on a worker that serves the pool's provider
# Per-host queues for sandboxes only their host can reach (the `local` provider).
HOST_QUEUE_PREFIX: Final = "playrun.host."

# Redis key prefixes.
KEY_PREFIX: Final = "playrun"
KEY_RUN_DONE: Final = f"{KEY_PREFIX}:run-done:"  # pub/sub channel per run
KEY_START_RATE: Final = f"{KEY_PREFIX}:startrate:"
# Per-attempt gateway budgets, fleet-wide: keys <prefix>{<run id>:<generation>}:<part>
# (tasks/gateway/fleet/).
KEY_GATEWAY: Final = f"{KEY_PREFIX}:gw:"
# Set of run ids whose start messages a worker node holds (received, not yet finished).
KEY_HELD_STARTS: Final = f"{KEY_PREFIX}:held-messages:"  # hash: task id -> run id
# hash: provider -> unix time until which a worker announced it serves it
KEY_SERVED_PROVIDERS: Final = f"{KEY_PREFIX}:served-providers"
# string per provider: creates failed in a row (transport, auth); expiring opens nothing
KEY_PROVIDER_CIRCUIT: Final = f"{KEY_PREFIX}:circuit:"
# Warm pools: a pub/sub channel that wakes standby runners' waits at the gateway, a hash of
# counters per pool, a refill lock and back-off per pool and host, hosts that keep local pools.
KEY_POOL_ASSIGNED: Final = f"{KEY_PREFIX}:pool:assigned"
KEY_POOL_STATS: Final = f"{KEY_PREFIX}:pool:stats:"
KEY_POOL_REFILL: Final = f"{KEY_PREFIX}:pool:refill:"
KEY_POOL_BACKOFF: Final = f"{KEY_PREFIX}:pool:backoff:"
KEY_POOL_HOSTS: Final = f"{KEY_PREFIX}:pool:hosts"
# Set while runs wait on a provider's start rate: its pools' refills yield to them.
KEY_POOL_YIELD: Final = f"{KEY_PREFIX}:pool:yield:"
POOL_STATS: Final = ("claims", "misses", "refills", "refill_errors", "expiries", "retired")
# The pool of runs that name no placement policy.
DEFAULT_POOL: Final = "default"
# Per-minute start-rate samples for the dashboard: one hash per bucket and minute, and
# the set of buckets that wrote any (tasks/acquisition/starthistory.py).
KEY_START_HISTORY: Final = f"{KEY_PREFIX}:starthist:"
START_HISTORY_TTL_S: Final = 2 * 3600
START_HISTORY_MINUTES: Final = 60

# A pooled PostgreSQL connection idle this long is pinged before use (tasks.store.db).
PING_IDLE_S: Final = 1.0

# Limits.
MAX_INPUT_BYTES: Final = 256 * 1024
MAX_OUTPUT_BYTES: Final = protocol.MAX_OUTPUT_BYTES
MAX_RESULT_FILE_BYTES: Final = 2 * 1024 * 1024
MAX_EVENT_BYTES: Final = protocol.MAX_EVENT_BYTES
MAX_PLAY_BYTES: Final = 1024 * 1024
MAX_INPUT_DEPTH: Final = 64  # nesting of lists and objects in a run input
MAX_INPUT_INT: Final = 2**63  # |n| < this: an int64 survives JSONB, SQLite and Python alike
# |x| < this for floats: from 1e16 up Python writes `4.1e+16`, which JSONB keeps as the
# numeric 41000000000000000 and hands back as an int, no longer equal to the float.
MAX_INPUT_FLOAT: Final = 1e16
MAX_ORG_ID_CHARS: Final = 128  # the runs.org_id and capacity_orgs.org_id columns
MAX_IDEMPOTENCY_KEY_CHARS: Final = 256  # runs.idempotency_key
MAX_PLAY_PATH_CHARS: Final = 1024  # runs.play_path
RUN_ID_PATTERN: Final = r"[0-9a-f]{32}"  # a UUID's hex: models.new_id's v7, and older v4 ids
MAX_LIST_RUNS: Final = 10_000
# Run listings and prefixes (tasks/store/runquery.py): a prefix names a run only from this long.
MIN_RUN_ID_PREFIX: Final = 6
# Retention (tasks/maintenance/retention.py): `playrun prune` and beat delete at most this
# many runs (or released receipts) per transaction.
RETENTION_BATCH_MAX: Final = 10_000
RUN_CODE_PATTERN: Final = r"[A-Z][A-Z0-9_]{0,63}"
# The operators' dashboard (tasks/dashboard/): page sizes and its self-refresh.
DASHBOARD_REFRESH_S: Final = 10
DASHBOARD_RUNS_PAGE: Final = 50
DASHBOARD_EVENTS_PAGE: Final = 200
DASHBOARD_MIN_TOKEN_CHARS: Final = 16
MAX_SUBMIT_BATCH: Final = 10_000  # runs per submit_runs call (one transaction)
# run_events pages: the default keeps the old call (no paging) bounded for huge ledgers.
DEFAULT_EVENTS_PAGE: Final = 10_000
MAX_EVENTS_PAGE: Final = 10_000
MAX_STARTS_PER_MINUTE: Final = 1_000_000.0  # the start-rate bucket's ceiling (startrate.maths)
MAX_SQL_INT: Final = 2**31 - 1  # an Integer column
MAX_SQL_BIGINT: Final = 2**63 - 1  # a BigInteger column (run_events.id)
MAX_DURATION_S: Final = 365 * 86400.0  # operator holds, throttles and waits
MAX_STATS_WINDOW_S: Final = 10 * 365 * 86400.0
# ctx.step: the step key and the JSON output a work receipt keeps.
MAX_STEP_KEY_CHARS: Final = protocol.MAX_STEP_KEY_CHARS
MAX_STEP_OUTPUT_BYTES: Final = protocol.MAX_STEP_OUTPUT_BYTES
MAX_STEP_TTL_S: Final = protocol.MAX_STEP_TTL_S
# Runtime sheets: what one request may carry.
SHEET_MAX_PAGE_ROWS: Final = protocol.SHEET_MAX_PAGE_ROWS
SHEET_MAX_KEY_BYTES: Final = protocol.SHEET_MAX_KEY_BYTES
SHEET_MAX_ROW_BYTES: Final = protocol.SHEET_MAX_ROW_BYTES
SHEET_MAX_READ_BYTES: Final = 2 * 1024 * 1024
# The development signing secret; refused when a PostgreSQL database is configured.
DEV_SECRET_KEY: Final = "playrun-dev-secret-do-not-use-in-production"
# The CLI, as a person at a terminal meets it: a broker that does not answer fails a
# submit within seconds, and a wait with no worker says so after this long.
CLI_BROKER_TIMEOUT_S: Final = 2.0
# How often a Sentinel client in use asks which server is the primary (tasks/store/redisconn.py).
SENTINEL_FOLLOW_S: Final = 0.5
# A start-rate call slower than this degrades to the in-memory pace (startrate/bucket.py).
START_RATE_TIMEOUT_S: Final = 2.0
CLI_NO_WORKER_HINT_S: Final = 5.0
# `playrun dev` writes the URLs of its stack here; the CLI reads them when PLAYRUN_* is unset.
DEV_STATE_FILE: Final = "dev.json"

# Fair share of starts between orgs (tasks/acquisition/fairshare/): one hash tag for all.
KEY_FAIR: Final = f"{KEY_PREFIX}:fair:{{fleet}}:"
FAIR_WEIGHT_DEFAULT: Final = 1
FAIR_WEIGHT_MAX: Final = 1000


class StartOrder(enum.StrEnum):
    """Which queued run's start goes to the broker next (PLAYRUN_START_ORDER)."""

    FAIR = "fair"  # by org, weighted: tasks/acquisition/fairshare/
    FIFO = "fifo"  # in order of admission, published at once
