"""The fair relay: publish queued starts in fair order, only as far ahead as the start
rate allows; the backlog stays in the outbox.

One relay pass at a time fleet-wide (a Redis lease, LEASE_MS): it reads, per org with
unsent starts, how many are due and how much capacity room it has, asks `pick` for the
order, claims those rows (marked sent, committed), counts them in flight, then publishes.
A start counts in flight until its worker is past the start permit (`taken`), so the
queue holds at most the window: the starts the rate admits in the next fair_ahead_s.
Anyone who wants a pass while another runs leaves a note, and the running pass goes
again. A relay that dies after the claim leaves runs still queued long after "sent":
the sweep's resend gives them back to the outbox (unsent) and they keep their place.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import Counter
from functools import lru_cache
from typing import Any

import redis
import sqlalchemy as sa

from models import Outbox, db_now
from tasks.acquisition import permits
from tasks.acquisition import policy as traffic
from tasks.acquisition.fairshare.order import Candidate
from tasks.acquisition.fairshare.store import FairStore
from tasks.acquisition.startrate import rules_for
from tasks.admission.relay import Message, publish, unmark
from tasks.broker.message import start_queues
from tasks.broker.publish import publisher
from tasks.constants import FAIR_WEIGHT_DEFAULT, LEASE_HELD
from tasks.errors import BrokerUnavailableError, StartRateReplyError
from tasks.settings import Settings, get_settings
from tasks.store.db import is_postgres, session_scope
from tasks.store.notify import redis_client

log = logging.getLogger("playrun.fair")

LEASE_MS = 10_000  # a relay pass that takes longer than this has died, or the DB is down
# The policy sizes only the window (a throttle's rate): read at most once a second per
# process, where every pass (about one per start) read it.
POLICY_TTL_S = 1.0
_policy: tuple[float, traffic.Policy] | None = None
_PASSES = 16  # at most this many passes under one lease

# Orgs with unsent starts, walked along ix_outbox_fair one org at a time (a loose index
# scan): the cost follows the number of orgs, not the backlog. Per org: runs due (at
# most :room), weight, capacity limit and leases held.
_CANDIDATES = """
WITH RECURSIVE orgs(org_id) AS (
    SELECT min(org_id) FROM outbox WHERE sent_at IS NULL AND org_id IS NOT NULL
    UNION ALL
    SELECT (SELECT min(o.org_id) FROM outbox o
            WHERE o.sent_at IS NULL AND o.org_id > orgs.org_id)
    FROM orgs WHERE orgs.org_id IS NOT NULL
)
SELECT orgs.org_id,
       (SELECT count(*) FROM (SELECT 1 FROM outbox o
                              WHERE o.sent_at IS NULL AND o.org_id = orgs.org_id
                                AND o.available_at <= {now} LIMIT :room) AS d),
       (SELECT c.weight FROM capacity_orgs c WHERE c.org_id = orgs.org_id),
       (SELECT c."limit" FROM capacity_orgs c WHERE c.org_id = orgs.org_id),
       (SELECT count(*) FROM capacity_leases l
        WHERE l.org_id = orgs.org_id AND l.state IN ({held}))
FROM orgs WHERE orgs.org_id IS NOT NULL
"""


@lru_cache(maxsize=4)
def _store(url: str) -> FairStore:
    return FairStore(redis_client(url))


def store() -> FairStore:
    return _store(get_settings().redis_url)


def window(settings: Settings, policy: traffic.Policy) -> int:
    """Starts the rates of the fleet's providers admit in the next fair_ahead_s. While
    starts are held they are still published at that pace: each is deferred (`hold`) and
    spends its deferral budget as in FIFO order, then comes back in its org's turn."""
    override = policy.starts_per_minute if policy.mode == traffic.THROTTLE else None
    limiter = permits.limiter()
    per_min = sum(min(state.rate for state in limiter.inspect(
        provider, rules_for(settings, provider, override))) for provider in settings.served)
    return max(1, min(settings.fair_max_ahead, math.ceil(per_min / 60 * settings.fair_ahead_s)))


def _sql(session: sa.orm.Session) -> str:
    now = db_now().compile(dialect=session.get_bind().dialect,
                           compile_kwargs={"literal_binds": True})
    held = ", ".join(f"'{state}'" for state in LEASE_HELD)
    return _CANDIDATES.format(now=now, held=held)


def candidates(settings: Settings, room: int) -> list[Candidate]:
    """Each org with unsent starts, in order of name (pick breaks ties by that order)."""
    limit_rooms = settings.capacity_mode == "enforce" and settings.capacity_full == "defer"
    with session_scope(readonly=True) as session:
        rows = session.execute(sa.text(_sql(session)), {"room": room}).all()
    out = []
    for org, due, weight, limit, held in rows:
        cap = settings.org_capacity if limit is None else int(limit)
        out.append(Candidate(str(org), int(weight or FAIR_WEIGHT_DEFAULT), int(due),
                             max(0, cap - int(held)) if limit_rooms else -1))
    return sorted(out, key=lambda c: c.org)


def _claim(wanted: Counter[str]) -> dict[str, list[tuple[str, str, list[Any]]]]:
    """Mark each org's first due unsent rows (by place) sent; one transaction."""
    out: dict[str, list[tuple[str, str, list[Any]]]] = {}
    with session_scope() as session:
        pg = is_postgres(session)
        for org, count in wanted.items():
            chosen = (sa.select(Outbox.id)
                      .where(Outbox.org_id == org, Outbox.sent_at.is_(None),
                             Outbox.available_at <= db_now())
                      .order_by(Outbox.place, Outbox.created_at).limit(count))
            if pg:
                chosen = chosen.with_for_update(skip_locked=True)
            rows = list(session.execute(
                sa.update(Outbox).where(Outbox.id.in_(chosen.scalar_subquery()))
                .values(sent_at=db_now(), publish_count=Outbox.publish_count + 1)
                .returning(Outbox.id, Outbox.task_name, Outbox.args, Outbox.place,
                           Outbox.created_at)).all())
            rows.sort(key=lambda r: (r.place, r.created_at))
            out[org] = [(r.id, r.task_name, list(r.args)) for r in rows]
    return out


def relay_pass(settings: Settings, fair: FairStore) -> int:
    """One pass: pick, claim, count in flight, publish. Returns starts published."""
    limit = window(settings, _current_policy())
    if limit <= 0:
        return 0
    cands = candidates(settings, limit)
    if not cands:
        return 0
    # Only the queues this fleet serves: a queue no worker takes must not close the window.
    picks = fair.pick(limit, publisher().waiting(start_queues(settings.served)), cands)
    if not picks:
        return 0
    claimed = _claim(Counter(picks))
    messages: list[Message] = []
    owners: list[tuple[str, str]] = []
    for org in picks:  # the fair order, across orgs
        if claimed.get(org):
            message = claimed[org].pop(0)
            messages.append(message)
            owners.append((message[0], org))
    if not messages:
        return 0
    fair.sent(owners)  # before the publish: a fast worker's `taken` must find them
    if not publish(messages):
        unmark([m[0] for m in messages])
        for task_id, _ in owners:
            fair.taken(task_id)
        return 0
    return len(messages)


def _current_policy() -> traffic.Policy:
    global _policy
    now = time.monotonic()
    if _policy is None or now - _policy[0] >= POLICY_TTL_S:
        _policy = (now, traffic.read())
    return _policy[1]


def pump(settings: Settings | None = None) -> int:
    """Run relay passes until nobody asks for another; never raises (the sweep retries)."""
    return _passes(settings or get_settings()) or 0


def ask() -> bool:
    """Passes for starts just admitted; False when Redis or the database did not answer
    (the sweep publishes them once they do)."""
    return _passes(get_settings()) is not None


def _passes(settings: Settings) -> int | None:
    try:
        return _pump(settings, store())
    except (redis.RedisError, sa.exc.SQLAlchemyError, StartRateReplyError,
            BrokerUnavailableError) as exc:
        log.warning("fair relay pass failed (%s: %s); the sweep tries again",
                    type(exc).__name__, exc)
        return None


def _pump(settings: Settings, fair: FairStore) -> int:
    total = 0
    for _ in range(3):
        token = uuid.uuid4().hex
        if not fair.lock(token, LEASE_MS):
            fair.ask_again(LEASE_MS)  # the pass running now goes again
            return total
        try:
            fair.asked_again()
            total += relay_pass(settings, fair)
            for _ in range(_PASSES - 1):
                if not fair.asked_again():
                    break
                total += relay_pass(settings, fair)
        finally:
            fair.unlock(token)
        if not fair.asked_again():  # asked between the last look and the unlock
            return total
    return total


def taken(task_id: str, settings: Settings | None = None) -> None:
    """A start message is past its permit (or ended before it): refill the window when it
    is half empty. Best effort: a lost report expires with the message's time in flight."""
    settings = settings or get_settings()
    try:
        done = store().taken(task_id)
    except (redis.RedisError, StartRateReplyError) as exc:
        log.warning("fair relay not told of start %s (%s)", task_id, exc)
        return
    if done.counted and done.inflight * 2 <= done.window:
        pump(settings)
