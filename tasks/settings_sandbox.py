"""Sandbox providers, placement and isolation settings (a part of tasks/settings.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from tasks.constants import MAX_SQL_INT
from tasks.settings_gateway import PLAYRUN_HOME


class SandboxSettings(BaseSettings):
    """PLAYRUN_* variables of sandboxes: providers, placement, isolation and limits."""

    model_config = SettingsConfigDict(env_prefix="PLAYRUN_", extra="ignore", frozen=True)

    sandbox_provider: str = Field(
        default="local",
        description="Sandbox provider: local, fake, daytona, e2b, modal or agentcore.")
    providers: str = Field(
        default="", max_length=400,
        description="Several providers in one fleet, comma-separated; the first is the "
                    "fleet's own when no placement policy applies. Unset: "
                    "PLAYRUN_SANDBOX_PROVIDER alone.")
    placement_default: str | None = Field(
        default=None, max_length=40,
        description="The placement policy of runs that name none and whose org has no "
                    "default.")
    provider_circuit_failures: int = Field(
        default=3, ge=1, le=1000,
        description="Creates failing this many times in a row (transport, auth) open a "
                    "provider's circuit: placement passes its attempts to a fallback.")
    provider_circuit_open_s: float = Field(
        default=30.0, gt=0, le=3600, description="How long an open circuit stays open.")
    sandbox_root: Path = Field(
        default=PLAYRUN_HOME / "sandboxes",
        description="Where local sandboxes live, and the provider's records of remote ones.")
    sandbox_isolation: Literal["auto", "strict", "process"] = Field(
        default="auto",
        description="strict: bubblewrap namespaces, only the sandbox directory writable, no "
                    "network but the gateway socket; process: a process group on the host "
                    "filesystem; auto: strict where it works.")
    sandbox_network: bool = Field(
        default=False,
        description="Outbound network for strict sandboxes: a risk, plays then reach "
                    "whatever the host reaches.")
    # Keep these ids free of other use on the host.
    sandbox_uid: int = Field(
        default=65534, gt=0,
        description="Host uid a worker running as root runs strict sandboxes as.")
    sandbox_gid: int = Field(
        default=65534, gt=0,
        description="Host gid a worker running as root runs strict sandboxes as.")
    sandbox_max_processes: int = Field(
        default=128, gt=0,
        description="Processes and threads one sandbox may have at once (RLIMIT_NPROC in its "
                    "own user namespace; pids.max with cgroup v2).")
    sandbox_max_dir_mb: int = Field(
        default=512, gt=0,
        description="Disk space a sandbox's directory may use; past it the sandbox is stopped.")
    sandbox_cgroup: Path | None = Field(
        default=None,
        description="A cgroup directory delegated for per-sandbox limits (cgroup v2: memory, "
                    "pids and cpu; a v1 `cpu` hierarchy: CPU share and quota); unset: "
                    "/sys/fs/cgroup/playrun as root on cgroup v2, /sys/fs/cgroup/cpu/playrun "
                    "as root on v1, else none.")
    sandbox_cpus: float = Field(
        default=1.0, gt=0, description="CPUs one sandbox may use (cpu.max with cgroup v2, "
                                       "cpu.cfs_quota_us with v1).")
    sandbox_nice: int = Field(
        default=10, ge=0, le=19,
        description="Scheduling niceness of a local sandbox's runner and play (0: as the "
                    "worker): the gateway and workers get the CPU first. Where the kernel "
                    "groups sessions (autogroup), it orders the play within its sandbox only; "
                    "the cgroup (PLAYRUN_SANDBOX_CGROUP) orders sandboxes.")
    gateway_public_url: str = Field(
        default="",
        description="The gateway URL a sandbox on another network uses (https in "
                    "production); required by the cloud providers.")
    sandbox_egress: Literal["gateway", "open"] = Field(
        default="gateway",
        description="Cloud sandboxes' network: gateway (only the gateway's host, where the "
                    "provider can limit egress) or open (anything).")
    provider_max_live: int | None = Field(
        default=None, gt=0, le=MAX_SQL_INT,
        description="Live sandboxes of this provider fleet-wide (providers cap them per "
                    "account); unset: no limit.")
    fleet: str = Field(
        default="default", min_length=1, max_length=40, pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="Label on every sandbox; garbage collection deletes only its own "
                    "fleet's orphans.")
    pool_tick_s: float = Field(
        default=1.0, gt=0, le=60,
        description="How often beat checks warm pools: retires expired, silent and surplus "
                    "members, then asks for refills.")
    pool_standby_wait_s: float = Field(
        default=10.0, ge=1, le=60,
        description="How long the gateway holds a warm sandbox's call for its assignment; "
                    "a ready member silent for three of these is replaced.")
    pool_refill_backoff_max_s: float = Field(
        default=60.0, ge=1,
        description="The longest a pool waits to refill after failed creates (doubling "
                    "from one tick).")
