"""Helpers for the work-receipt tests at the gateway: attempts launched by hand (no
worker), and the step actions called on a real `playrun gateway`."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import tasks
from models import Outbox, db_now
from tasks.admission.submit import admit
from tasks.execution.launch import mark_launching
from tasks.settings import get_settings
from tasks.store.db import session_scope
from tests.support.gateway import Launched, call
from tests.support.paths import NOOP
from tests.support.runs import must_claim
from tests.support.stack import Gateway

ORG_PREFIX = "rcg-"


def org() -> str:
    return f"{ORG_PREFIX}{uuid.uuid4().hex[:8]}"


def launched(org_id: str | None = None, play: Path = NOOP) -> Launched:
    admitted = admit(play, {}, org_id or org(), None)
    with session_scope() as session:  # keep it off the broker: the test drives it
        session.execute(sa.update(Outbox).where(Outbox.id == admitted.outbox_id)
                        .values(sent_at=db_now()))
    fence = must_claim(admitted.run_id)
    launch_id = mark_launching(fence, get_settings())
    assert launch_id is not None
    return Launched(fence, launch_id, tasks.get_run(admitted.run_id).org_id)


def act(gw: Gateway, run: Launched, body: dict[str, Any]) -> Any:
    response = call(gw, run.token(), body)
    assert response.status_code == 200, response.text
    return response.json()["result"]


def claim(gw: Gateway, run: Launched, key: str, claim_id: str = "c1") -> Any:
    return act(gw, run, {"action": "step_claim", "key": key, "claim_id": claim_id})


def complete(gw: Gateway, run: Launched, key: str, output: Any, claim_id: str = "c1",
             ttl_s: float | None = None) -> Any:
    return act(gw, run, {"action": "step_complete", "key": key, "claim_id": claim_id,
                         "output": output, "ttl_s": ttl_s})


def step_events(run: Launched) -> list[tuple[str, dict[str, Any]]]:
    return [(e.kind, e.data) for e in tasks.run_events(run.fence.run_id)
            if e.kind.startswith("step.") or e.kind == "receipts.released"]


def receipt(org_id: str, key: str) -> tasks.ReceiptView:
    (found,) = [r for r in tasks.receipts(org_id) if r.key == key]
    return found
