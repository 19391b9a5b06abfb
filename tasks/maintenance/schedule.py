"""`celery -A tasks beat`: refuse to start on an old schema, then run the maintenance tasks."""

from __future__ import annotations

from typing import Any

from celery.beat import Scheduler

from tasks.constants import (
    MAINTENANCE_QUEUE,
    TASK_POOL_TICK,
    TASK_PRUNE_HISTORY,
    TASK_REAP,
    TASK_SANDBOX_GC,
    TASK_SWEEP_OUTBOX,
)
from tasks.errors import PlayrunError
from tasks.settings import get_settings
from tasks.store.db import require_current_schema


class CheckedScheduler(Scheduler):
    """An in-memory scheduler (no schedule file) that checks the schema first."""

    def setup_schedule(self) -> None:
        try:
            get_settings().check_for_server()
            require_current_schema()
        except PlayrunError as exc:
            raise SystemExit(f"playrun beat refused to start: {exc}") from exc
        settings = get_settings()
        entries: dict[str, dict[str, Any]] = {
            "playrun-sweep-outbox": {"task": TASK_SWEEP_OUTBOX,
                                     "schedule": settings.sweep_interval_s},
            "playrun-reap": {"task": TASK_REAP, "schedule": settings.reap_interval_s},
            "playrun-sandbox-gc": {"task": TASK_SANDBOX_GC, "schedule": settings.gc_interval_s},
            "playrun-pool-tick": {"task": TASK_POOL_TICK, "schedule": settings.pool_tick_s},
        }
        if settings.retention_days > 0:
            entries["playrun-retention"] = {"task": TASK_PRUNE_HISTORY,
                                            "schedule": settings.retention_interval_s}
        for entry in entries.values():
            # Maintenance that misses its slot is just late; never let copies pile up.
            entry["options"] = {"queue": MAINTENANCE_QUEUE, "expires": entry["schedule"]}
        self.app.conf.beat_schedule = {**entries, **(self.app.conf.beat_schedule or {})}
        super().setup_schedule()
        self.merge_inplace(self.app.conf.beat_schedule)
