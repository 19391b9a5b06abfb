"""The gateway's settings and what runners are told (a part of tasks/settings.py)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from tasks.constants import DEV_SECRET_KEY, MAX_SQL_INT, SHEET_MAX_PAGE_ROWS

# Where the embedded default keeps its database, sockets and sandboxes.
PLAYRUN_HOME = Path.home() / ".playrun"


class GatewaySettings(BaseSettings):
    """PLAYRUN_* variables of the gateway, its budgets and the runner's cadence."""

    model_config = SettingsConfigDict(env_prefix="PLAYRUN_", extra="ignore", frozen=True)

    gateway_url: str = Field(
        default="http://127.0.0.1:8765",
        description="Where the gateway listens over TCP, and where local sandboxes call back.")
    # Its directory is bound into each sandbox, so keep nothing else in it.
    gateway_socket: Path = Field(
        default=PLAYRUN_HOME / "gateway" / "gateway.sock",
        description="The gateway's Unix socket; strict sandboxes reach the gateway only "
                    "through it (its directory is bound into each sandbox).")
    gateway_workers: int | None = Field(
        default=None, ge=1, le=64,
        description="Gateway processes serving the same TCP port and Unix socket (`playrun "
                    "gateway --workers N` wins); unset: one per core, at most 4.")
    gateway_max_body_bytes: int = Field(
        default=4 * 1024 * 1024, gt=0,
        description="Largest request body the gateway reads (a result document is at most "
                    "about 1 MiB).")
    gateway_max_body_values: int = Field(
        default=200_000, gt=0,
        description="Values and containers one request body may hold, counted before it is "
                    "decoded.")
    gateway_attempt_in_flight: int = Field(
        default=8, ge=1, description="Requests one attempt may have in flight at the gateway.")
    gateway_attempt_requests_per_s: float = Field(
        default=50.0, gt=0,
        description="Requests per second one attempt may send (a token bucket; an honest "
                    "runner stays far below it).")
    gateway_attempt_request_burst: float = Field(
        default=200.0, ge=1, description="Burst of the per-attempt request bucket.")
    gateway_attempt_bytes_per_s: float = Field(
        default=4 * 1024 * 1024, gt=0,
        description="Request bytes per second one attempt may send (its burst is twice the "
                    "largest body).")
    gateway_shared_budgets: bool = Field(default=True, description="Per-attempt budgets and "
        "refusal counts in Redis, fleet-wide; off (or Redis down): each gateway process its own.")
    gateway_abuse_refusals: int = Field(
        default=3000, ge=1, le=MAX_SQL_INT,
        description="Refused requests that fail an attempt GATEWAY_ABUSE: a leaky count that "
                    "drains this many per PLAYRUN_GATEWAY_ABUSE_WINDOW_S; past it the "
                    "gateway ends the attempt and frees its sandbox.")
    gateway_abuse_window_s: float = Field(
        default=60.0, gt=0, le=86400,
        description="The window of PLAYRUN_GATEWAY_ABUSE_REFUSALS: an attempt with at most "
                    "that many refusals in every window is never failed; one with more than "
                    "twice as many in one window always is.")
    heartbeat_interval_s: float = Field(
        default=5.0, gt=0, description="Seconds between a runner's heartbeats.")
    heartbeat_timeout_s: float = Field(
        default=30.0, gt=0,
        description="A runner silent this long is inspected on its host by the reaper.")
    exit_report: bool = Field(
        default=True,
        description="A sandbox reports its runner's exit to the gateway at once (a local "
                    "sandbox's supervisor, a cloud sandbox's boot script), so a runner that "
                    "ends without settling is inspected in seconds; off, only the heartbeat "
                    "timeout notices it.")
    gateway_beat_window_s: float = Field(
        default=0.1, ge=0, le=1.0,
        description="The gateway answers all heartbeats of this window in one transaction.")
    progress_max_events: int = Field(
        default=10_000, ge=0,
        description="Progress events kept per attempt; beyond it one event counts the rest.")
    step_max_events: int = Field(
        default=10_000, ge=0,
        description="Step ledger rows (completed, failed, taken over, first reuse of a key) "
                    "per attempt; beyond it one event says the budget is spent.")
    sheet_page_rows: int = Field(
        default=500, ge=1, le=SHEET_MAX_PAGE_ROWS,
        description="Runtime sheets: rows a runner admits per request.")
    sheet_write_rows: int = Field(
        default=200, ge=1, le=SHEET_MAX_PAGE_ROWS,
        description="Runtime sheets: row results a runner writes per request.")
    secret_key: str = Field(
        default=DEV_SECRET_KEY,
        description="Signs runner tokens; workers and the gateway refuse the built-in "
                    "development value on PostgreSQL.")
