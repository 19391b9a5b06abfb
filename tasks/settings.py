"""Settings, read once from PLAYRUN_* environment variables (docs/operations.md)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from tasks.constants import (
    BROKER_SCHEMES,
    DEV_SECRET_KEY,
    MAX_SQL_INT,
    PROVIDER_NAMES,
    RETENTION_BATCH_MAX,
    StartOrder,
)
from tasks.errors import ConfigurationError
from tasks.parse.redisurl import parse
from tasks.settings_db import DatabaseSettings
from tasks.settings_gateway import PLAYRUN_HOME, GatewaySettings
from tasks.settings_sandbox import SandboxSettings


class Settings(GatewaySettings, SandboxSettings, DatabaseSettings):
    """Every PLAYRUN_* environment variable, read once per process (docs/operations.md)."""

    model_config = SettingsConfigDict(env_prefix="PLAYRUN_", extra="ignore", frozen=True)

    database_url: str = Field(
        default=f"sqlite:///{PLAYRUN_HOME / 'playrun.db'}",
        description="SQLAlchemy URL of the database (PostgreSQL in production).")
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="Redis: the Celery result backend, playrun's own keys, and the broker "
                    "unless PLAYRUN_BROKER_URL names another; redis://host:port/db, or "
                    "redis+sentinel://host:port[,host:port]/service/db for the primary Redis "
                    "Sentinel names.")
    broker_url: str = Field(
        default="",
        description="The Celery broker when not PLAYRUN_REDIS_URL: amqp://user:password@host:"
                    "5672/vhost for RabbitMQ (quorum queues, publisher confirms).")
    start_rate_redis_url: str | None = Field(
        default=None,
        description="Redis of the start-rate buckets alone, when not PLAYRUN_REDIS_URL: any "
                    "form of that, or redis+cluster://host:port[,host:port] (Redis Cluster).")
    org_capacity: int = Field(
        default=10, ge=0, le=MAX_SQL_INT,
        description="Concurrent sandboxes per org (per-org overrides: playrun capacity set).")
    capacity_mode: Literal["enforce", "observe"] = Field(
        default="enforce",
        description="enforce the org capacity, or only observe (count and report) it.")
    capacity_full: Literal["fail", "defer"] = Field(
        default="fail",
        description="In enforce mode, a full org fails the run, or defers it within the "
                    "deferral budget.")
    capacity_reservation_ttl_s: float = Field(
        default=120.0,
        description="Seconds before the reaper releases a reservation whose sandbox was "
                    "never reported live.")

    lease_seconds: float = Field(
        default=20.0, gt=0,
        description="Attempt lease while acquiring; the reaper recovers expired ones (after "
                    "launch the heartbeats hold the lease).")
    run_timeout_s: float = Field(
        default=600.0, gt=0, description="Wall-clock limit of a play.")
    sandbox_memory_mb: int = Field(
        default=1024, gt=0, description="Memory limit of a sandbox, in MiB.")
    sandbox_max_file_mb: int = Field(
        default=64, gt=0, description="Largest file a sandbox may write, in MiB.")

    start_rate_initial_per_min: float = Field(
        default=60.0, gt=0, description="Start rate per provider bucket at first use.")
    start_rate_max_per_min: float = Field(
        default=600.0, gt=0, description="Highest start rate a bucket grows to.")
    start_rate_floor_per_min: float = Field(
        default=6.0, gt=0, description="Lowest start rate pushback cuts a bucket to.")
    start_rate_increase_per_min: float = Field(
        default=6.0, ge=0,
        description="Rate added per accepted create (additive increase).")
    start_rate_decrease_factor: float = Field(
        default=0.5, gt=0, lt=1,
        description="Factor the rate is multiplied by on provider pushback.")
    start_rate_cooldown_ms: int = Field(
        default=15_000, ge=0,
        description="After a cut, how long a bucket holds its rate before growing again.")
    start_rate_global_max_per_min: float | None = Field(
        default=None,
        description="A second, fixed rule every start must also pass; unset: none.")
    start_local_sleep_ms: int = Field(
        # Past one interval at 30/min: the next caller holds the next slot, not a deferral.
        default=2000, ge=0,
        description="Longest in-place wait for a start permit; longer waits defer the "
                    "attempt.")

    start_order: StartOrder = Field(
        default=StartOrder.FAIR,
        description="fair: starts go to the broker by org, weighted by `playrun capacity set "
                    "--weight`, only as far ahead as the start rate allows; fifo: in order "
                    "of admission, all at once.")
    fair_ahead_s: float = Field(
        default=1.0, gt=0, le=60,
        description="Fair order: start messages in flight, as seconds of the current start "
                    "rate.")
    fair_max_ahead: int = Field(
        default=200, ge=1, le=10_000,
        description="Fair order: the most start messages in flight, the bound on the start "
                    "queues' length.")

    deferral_max_count: int = Field(
        default=20, ge=0, description="Deferrals a run may take before it fails.")
    deferral_max_total_s: float = Field(
        default=1800.0, ge=0, description="Total time a run may spend deferred.")
    deferral_base_ms: int = Field(
        default=1000, ge=1, description="First deferral backoff.")
    deferral_max_ms: int = Field(
        default=60_000, ge=1, description="Longest deferral backoff.")
    max_countdown_s: float = Field(
        default=30.0, gt=0,
        description="Longest Celery countdown used; longer waits go through the database.")
    visibility_timeout_s: float = Field(
        default=3600.0, gt=0,
        description="Broker visibility timeout; must exceed twice PLAYRUN_MAX_COUNTDOWN_S.")

    # Recovery takes about two or three of these: a worker's broker channel has several.
    network_timeout_s: float = Field(
        default=10.0, ge=4, le=3600,
        description="A PostgreSQL or Redis connection silent this long is dropped as dead, so "
                    "a half-open connection never hangs a process; raise it on a slow WAN.")

    worker_watchdog_s: float = Field(
        default=60.0, ge=0,
        description="A worker that receives none of its own pings for this long exits for "
                    "its supervisor to restart it (0 disables).")

    metrics_enabled: bool = Field(
        default=True, description="Serve Prometheus metrics.")
    metrics_worker_addr: str = Field(
        default="127.0.0.1:9464",
        description="host:port of a worker's metrics listener (port 0: a free one, written "
                    "to the metrics directory).")
    metrics_beat_addr: str = Field(
        default="127.0.0.1:9465", description="host:port of beat's metrics listener.")
    metrics_gateway_addr: str = Field(
        default="127.0.0.1:9466",
        description="host:port of the gateway's metrics listener (never its runtime port).")
    metrics_dir: Path = Field(
        default=PLAYRUN_HOME / "metrics",
        description="Worker children's multiprocess files, and every listener's URL file.")
    metrics_top_orgs: int = Field(
        default=20, ge=0, le=1000,
        description="Orgs named in the capacity gauges (most leases held); the rest are "
                    "\"other\".")

    sweep_interval_s: float = Field(
        default=5.0, gt=0, description="How often beat's outbox sweep runs.")
    reap_interval_s: float = Field(
        default=5.0, gt=0, description="How often beat's reaper runs.")
    gc_interval_s: float = Field(
        default=60.0, gt=0, description="How often beat's sandbox garbage collection runs.")
    gc_grace_s: float = Field(
        default=60.0, ge=0,
        description="Age before garbage collection deletes a sandbox no attempt holds.")
    outbox_resend_after_s: float = Field(
        default=10.0, ge=0,
        description="A run still queued this long after its start was sent is sent again.")
    retention_days: int = Field(
        default=30, ge=0, le=36500,
        description="Beat deletes ended runs (their ledger, attempts, sandboxes, leases) and "
                    "released receipts older than this many days; 0 keeps everything.")
    retention_interval_s: float = Field(
        default=300.0, gt=0, description="How often beat's retention pass runs.")
    retention_batch: int = Field(
        default=500, ge=1, le=RETENTION_BATCH_MAX,
        description="Runs (or receipts) retention deletes per transaction.")
    retention_batches_per_pass: int = Field(
        default=20, ge=1, le=10_000,
        description="Batches one retention pass takes at most; the next pass goes on.")
    release_grace_s: float = Field(
        default=30.0, ge=0,
        description="The reaper releases what an ended attempt still holds only this long "
                    "after it ended.")

    dashboard_addr: str = Field(
        default="127.0.0.1:8790",
        description="Where playrun dashboard listens (never the gateway's port).")
    dashboard_token: str | None = Field(
        default=None,
        description="The dashboard's read token (at least 16 characters; required on "
                    "PostgreSQL).")
    dashboard_write_token: str | None = Field(
        default=None,
        description="A second dashboard token that may also run a run again.")

    @property
    def served(self) -> tuple[str, ...]:
        """The providers this process serves, the fleet's own first."""
        names = tuple(dict.fromkeys(n.strip() for n in self.providers.split(",") if n.strip()))
        return names or (self.sandbox_provider,)

    @property
    def primary_provider(self) -> str:
        return self.served[0]

    @property
    def celery_broker_url(self) -> str:
        """Where task messages go: PLAYRUN_BROKER_URL, else PLAYRUN_REDIS_URL."""
        return self.broker_url or self.redis_url

    @property
    def is_postgres(self) -> bool:
        return self.database_url.startswith("postgresql")

    def check(self) -> Settings:
        if parse(self.redis_url).kind == "cluster":
            raise ConfigurationError(
                "PLAYRUN_REDIS_URL cannot be a Redis Cluster (Celery's broker has no Cluster "
                "transport); set PLAYRUN_START_RATE_REDIS_URL to the cluster instead")
        if self.start_rate_redis_url is not None:
            parse(self.start_rate_redis_url)
        if self.visibility_timeout_s <= self.max_countdown_s * 2:
            raise ConfigurationError(
                "PLAYRUN_VISIBILITY_TIMEOUT_S must exceed twice PLAYRUN_MAX_COUNTDOWN_S",
            )
        if self.broker_url and urlsplit(self.broker_url).scheme not in BROKER_SCHEMES:
            raise ConfigurationError(
                "PLAYRUN_BROKER_URL must be a redis://, rediss://, amqp:// or amqps:// URL")
        for addr in (self.metrics_worker_addr, self.metrics_beat_addr, self.metrics_gateway_addr):
            parse_addr(addr)
        port = parse_addr(self.metrics_gateway_addr)[1]
        if port and port == (urlsplit(self.gateway_url).port or 8765):
            raise ConfigurationError(
                "PLAYRUN_METRICS_GATEWAY_ADDR must not be the gateway's runtime port "
                "(PLAYRUN_GATEWAY_URL): sandboxes reach that one",
            )
        # An unknown name is the worker's to refuse, with its own code (tasks/worker/boot.py).
        remote = [name for name in self.served
                  if name in PROVIDER_NAMES and name not in ("local", "fake")]
        if remote:
            scheme = urlsplit(self.gateway_public_url).scheme
            if scheme not in ("http", "https"):
                raise ConfigurationError(
                    f"sandbox provider {remote[0]!r} runs sandboxes on another "
                    "network: set PLAYRUN_GATEWAY_PUBLIC_URL to the gateway's http(s) URL "
                    "as they reach it")
        return self

    def runner_gateway_url(self, provider: str | None = None) -> str:
        """The gateway as the runner reaches it (in a sandbox of `provider`)."""
        if (provider or self.sandbox_provider) in ("local", "fake"):
            return self.gateway_url
        return self.gateway_public_url

    def gateway_listen_address(self) -> tuple[str, int]:
        """The host and TCP port the gateway listens on, from `gateway_url`."""
        parts = urlsplit(self.gateway_url)
        return parts.hostname or "127.0.0.1", parts.port or 8765

    def check_for_server(self) -> Settings:
        """Workers and the gateway refuse the development secret on PostgreSQL."""
        self.check()
        if self.is_postgres and self.secret_key == DEV_SECRET_KEY:
            raise ConfigurationError(
                "PLAYRUN_SECRET_KEY is the built-in development secret; set a real one "
                "before running against PostgreSQL",
            )
        return self


def parse_addr(value: str) -> tuple[str, int]:
    """A listen address `host:port` (`[::1]:9464` for IPv6); port 0 picks a free one."""
    host, sep, port = value.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigurationError(f"metrics address {value[:100]!r} is not host:port")
    return host, int(port)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings().check()


def reset_settings() -> None:
    """Forget the cached settings (tests and the demo set variables first)."""
    get_settings.cache_clear()
