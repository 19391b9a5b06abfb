"""What operators see of the fair order: each org's backlog and weight."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from models import CapacityOrg, Run
from tasks.constants import FAIR_WEIGHT_DEFAULT, RunStatus


def backlogs(session: Session) -> dict[str, int]:
    """Queued runs by org (walks the partial index of queued runs)."""
    return {org: int(n) for org, n in session.execute(
        sa.select(Run.org_id, sa.func.count()).where(Run.status == RunStatus.QUEUED)
        .group_by(Run.org_id))}


def weights(session: Session, orgs: list[str]) -> dict[str, int]:
    """Each of `orgs`' weight (the default for an org without a row)."""
    rows = session.execute(sa.select(CapacityOrg.org_id, CapacityOrg.weight).where(
        CapacityOrg.org_id.in_(orgs))).all() if orgs else []
    found = {org: int(w) for org, w in rows}
    return {org: found.get(org, FAIR_WEIGHT_DEFAULT) for org in orgs}


def top(counts: dict[str, int], n: int, other: str) -> dict[str, int]:
    """At most n orgs named (largest first, then by id), the rest summed under `other`."""
    out: dict[str, int] = {}
    for i, org in enumerate(sorted(counts, key=lambda o: (-counts[o], o))):
        label = org if i < n else other
        out[label] = out.get(label, 0) + counts[org]
    return out
