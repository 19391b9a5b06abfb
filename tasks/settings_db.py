"""PostgreSQL connection pool settings (a part of tasks/settings.py)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DatabaseSettings(BaseSettings):
    """PLAYRUN_DB_* variables: each process's connection pools and the pooler in front."""

    model_config = SettingsConfigDict(env_prefix="PLAYRUN_", extra="ignore", frozen=True)

    db_pool_size: int = Field(
        default=10, ge=1, le=1000,
        description="PostgreSQL connections each of a process's two pools (transactions, "
                    "autocommit statements) keeps open once opened (docs/operations.md "
                    "\"Connections\").")
    db_max_overflow: int = Field(
        default=5, ge=0, le=1000,
        description="Connections each pool opens beyond PLAYRUN_DB_POOL_SIZE under load, "
                    "closed when handed back: a process holds at most "
                    "2 x (size + overflow).")
    db_pool_timeout_s: float = Field(
        default=30.0, gt=0, le=3600,
        description="How long a thread waits for a connection of a full pool before its "
                    "request fails.")
    db_pool_recycle_s: float = Field(
        default=0.0, ge=0,
        description="Connections older than this are closed and opened again at their next "
                    "use (a proxy or firewall that drops old connections); 0: never.")
    db_pgbouncer: bool = Field(
        default=False,
        description="PLAYRUN_DATABASE_URL is a PgBouncer in transaction pooling mode: no "
                    "prepared statements and no startup options (docs/design.md).")
