"""A work receipt's key and the liveness of its owner (docs/design.md).

A receipt is keyed by sha256 of (org, play name, step key) and owned by the launch of the
attempt that claimed it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePath

import sqlalchemy as sa

from models import Attempt, Run, WorkReceipt, db_now
from tasks.constants import TERMINAL_STATUSES, AttemptState


def play_name(play_path: str) -> str:
    """A play's name is its file name without `.py` (`plays/enrich.py` -> `enrich`)."""
    name = PurePath(play_path).name
    return name[:-3] if name.endswith(".py") and len(name) > 3 else name


def receipt_key(org_id: str, play: str, step_key: str) -> str:
    """sha256 of the three parts, encoded without ambiguity (a JSON array)."""
    text = json.dumps([org_id, play, step_key], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def owner_live(lease_grace_s: float | None = None) -> sa.ColumnElement[bool]:
    """True for a receipt whose owning launch can still write: its attempt is active in the
    run's current generation and the run is open. With `lease_grace_s`, also its lease ran
    out less than that long ago (a claim takes over from a holder silent for longer; the
    reaper adopts a silent runner well before). Correlates to WorkReceipt."""
    where = [Attempt.run_id == WorkReceipt.owner_run_id,
             Attempt.generation == WorkReceipt.owner_generation,
             Attempt.launch_id == WorkReceipt.owner_launch_id,
             Attempt.state == AttemptState.ACTIVE,
             Run.current_generation == Attempt.generation,
             Run.status.not_in(list(TERMINAL_STATUSES))]
    if lease_grace_s is not None:
        where.append(Attempt.lease_expires_at > db_now(-lease_grace_s))
    return sa.select(Attempt.id).join(Run, Run.id == Attempt.run_id).where(*where).exists()
