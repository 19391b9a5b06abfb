"""Settings, read once from PLAYRUN_* environment variables (SPEC section 5)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from tasks.constants import DEV_SECRET_KEY, MAX_SQL_INT, SHEET_MAX_PAGE_ROWS, StartOrder
from tasks.errors import ConfigurationError

_HOME = Path.home() / ".playrun"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PLAYRUN_", extra="ignore", frozen=True)

    database_url: str = f"sqlite:///{_HOME / 'playrun.db'}"
    redis_url: str = "redis://127.0.0.1:6379/0"
    gateway_url: str = "http://127.0.0.1:8765"
    # The gateway also listens here; strict sandboxes reach it only through this socket.
    # Its directory is bound into each sandbox, so keep nothing else in it.
    gateway_socket: Path = _HOME / "gateway" / "gateway.sock"
    # Largest request body the gateway reads; a result document is at most ~1 MiB.
    gateway_max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    # The runner heartbeats this often; a runner silent for heartbeat_timeout_s is inspected.
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    heartbeat_timeout_s: float = Field(default=30.0, gt=0)
    # The gateway answers all heartbeats of this window in one transaction: at most
    # 1/window commits per second for beats, however many plays run.
    gateway_beat_window_s: float = Field(default=0.1, ge=0, le=1.0)
    # Progress events kept per attempt; beyond this one event records how many were dropped.
    progress_max_events: int = Field(default=10_000, ge=0)
    # Runtime sheets: rows a runner admits per request, and row results it writes per request.
    sheet_page_rows: int = Field(default=500, ge=1, le=SHEET_MAX_PAGE_ROWS)
    sheet_write_rows: int = Field(default=200, ge=1, le=SHEET_MAX_PAGE_ROWS)
    # Gateway actions this gateway refuses as unknown (stands in for an older release).
    gateway_withdrawn_actions: list[str] = []
    secret_key: str = DEV_SECRET_KEY
    sandbox_provider: str = "local"
    sandbox_root: Path = _HOME / "sandboxes"
    # strict: bubblewrap namespaces, only the sandbox dir writable, no network but the
    # gateway socket; process: a process group on the host filesystem; auto: strict if it works.
    sandbox_isolation: Literal["auto", "strict", "process"] = "auto"
    # Outbound network for strict sandboxes: a risk (plays reach whatever the host reaches).
    sandbox_network: bool = False
    # A worker running as root runs strict sandboxes as this unprivileged host uid/gid
    # (uid 1000 inside their user namespace); keep it free of other use on the host.
    sandbox_uid: int = Field(default=65534, gt=0)
    sandbox_gid: int = Field(default=65534, gt=0)
    # Processes (threads included) one sandbox may have at once (RLIMIT_NPROC, counted in
    # its own user namespace; also pids.max where cgroup v2 is available).
    sandbox_max_processes: int = Field(default=128, gt=0)
    # Disk a sandbox's directory may use in all; past it the sandbox is stopped.
    sandbox_max_dir_mb: int = Field(default=512, gt=0)
    # A cgroup v2 directory delegated to playrun for per-sandbox memory/pids/cpu limits;
    # unset: /sys/fs/cgroup/playrun when running as root on a cgroup v2 host, else none.
    sandbox_cgroup: Path | None = None
    sandbox_cpus: float = Field(default=1.0, gt=0)
    org_capacity: int = Field(default=10, ge=0, le=MAX_SQL_INT)
    capacity_mode: Literal["enforce", "observe"] = "enforce"
    # In `enforce`, a full org fails the run, or with `defer` waits through the bounded deferral.
    capacity_full: Literal["fail", "defer"] = "fail"
    # Seconds before an unreported reservation is released by the reaper.
    capacity_reservation_ttl_s: float = 120.0

    # Attempt lease while acquiring (renewed at each step); the reaper recovers expired
    # ones, so a worker killed before launch costs about this long. After launch the
    # runner's heartbeats hold the lease (heartbeat_timeout_s).
    lease_seconds: float = Field(default=20.0, gt=0)
    # Runner wall-clock limit per run.
    run_timeout_s: float = Field(default=600.0, gt=0)
    sandbox_memory_mb: int = Field(default=1024, gt=0)
    sandbox_max_file_mb: int = Field(default=64, gt=0)

    # Start-rate bucket defaults, per provider (SPEC 4.3).
    start_rate_initial_per_min: float = Field(default=60.0, gt=0)
    start_rate_max_per_min: float = Field(default=600.0, gt=0)
    start_rate_floor_per_min: float = Field(default=6.0, gt=0)
    start_rate_increase_per_min: float = Field(default=6.0, ge=0)
    start_rate_decrease_factor: float = Field(default=0.5, gt=0, lt=1)
    start_rate_cooldown_ms: int = Field(default=15_000, ge=0)
    start_rate_global_max_per_min: float | None = None
    # Waits at most this long in place for a permit; longer waits defer the attempt.
    start_local_sleep_ms: int = Field(default=1000, ge=0)

    # fair: starts go to the broker by org, weighted, only as far ahead as the start rate
    # allows (tasks/acquisition/fairshare/); fifo: in order of admission, all at once.
    start_order: StartOrder = StartOrder.FAIR
    # Fair order: start messages in flight, as seconds of the current start rate...
    fair_ahead_s: float = Field(default=1.0, gt=0, le=60)
    # ... and never more than this many: the bound on the start queue's length.
    fair_max_ahead: int = Field(default=200, ge=1, le=10_000)

    # Bounded deferral of pre-code failures (SPEC 4.6).
    deferral_max_count: int = Field(default=20, ge=0)
    deferral_max_total_s: float = Field(default=1800.0, ge=0)
    deferral_base_ms: int = Field(default=1000, ge=1)
    deferral_max_ms: int = Field(default=60_000, ge=1)
    # Longest Celery countdown the code uses; longer waits go through the database.
    max_countdown_s: float = Field(default=30.0, gt=0)
    # Broker visibility timeout; must exceed every countdown (checked below).
    visibility_timeout_s: float = Field(default=3600.0, gt=0)

    # A PostgreSQL or Redis connection that answers nothing for this long is dropped as
    # dead (connect, keepalive and read bounds: tasks/store/netguard.py), so a half-open
    # connection after a failover or partition never hangs a worker, beat or the gateway.
    # Waits on a dead connection can come one after another (a worker's broker channel
    # has several), so recovery takes about two or three of these. Raise it on a slow WAN.
    network_timeout_s: float = Field(default=10.0, ge=4, le=3600)

    # A worker that receives none of its own pings for this long exits (0 disables).
    worker_watchdog_s: float = Field(default=60.0, ge=0)

    # Prometheus endpoints, one per process kind (README "Metrics"); port 0 picks a free
    # port and the process writes its URL to <metrics_dir>/<kind>-<pid>.url.
    metrics_enabled: bool = True
    metrics_worker_addr: str = "127.0.0.1:9464"
    metrics_beat_addr: str = "127.0.0.1:9465"
    metrics_gateway_addr: str = "127.0.0.1:9466"
    # Worker children write multiprocess files under <metrics_dir>/worker-<pid>/.
    metrics_dir: Path = _HOME / "metrics"
    # Capacity gauges label this many orgs (most leases held) by name, the rest "other".
    metrics_top_orgs: int = Field(default=20, ge=0, le=1000)

    # Maintenance cadence for `celery beat`.
    sweep_interval_s: float = Field(default=5.0, gt=0)
    reap_interval_s: float = Field(default=5.0, gt=0)
    gc_interval_s: float = Field(default=60.0, gt=0)
    gc_grace_s: float = Field(default=60.0, ge=0)
    outbox_resend_after_s: float = Field(default=10.0, ge=0)
    # The reaper releases what an ended attempt still holds only this long after it ended:
    # before that the run's own release task is usually on its way.
    release_grace_s: float = Field(default=30.0, ge=0)

    # The operators' dashboard (`playrun dashboard`): its own listener, a read token and a
    # separate token for "run again"; without a read token it starts only on SQLite.
    dashboard_addr: str = "127.0.0.1:8790"
    dashboard_token: str | None = None
    dashboard_write_token: str | None = None

    @property
    def is_postgres(self) -> bool:
        return self.database_url.startswith("postgresql")

    def check(self) -> Settings:
        if self.visibility_timeout_s <= self.max_countdown_s * 2:
            raise ConfigurationError(
                "PLAYRUN_VISIBILITY_TIMEOUT_S must exceed twice PLAYRUN_MAX_COUNTDOWN_S",
            )
        for addr in (self.metrics_worker_addr, self.metrics_beat_addr, self.metrics_gateway_addr):
            parse_addr(addr)
        port = parse_addr(self.metrics_gateway_addr)[1]
        if port and port == (urlsplit(self.gateway_url).port or 8765):
            raise ConfigurationError(
                "PLAYRUN_METRICS_GATEWAY_ADDR must not be the gateway's runtime port "
                "(PLAYRUN_GATEWAY_URL): sandboxes reach that one",
            )
        return self

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
