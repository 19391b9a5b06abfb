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
While the last pass left nothing unsent, an admission's own start skips the queue
(`skip_queue`): picked alone, written sent and published by the admitting process.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from collections import Counter
from dataclasses import replace
from functools import lru_cache
from typing import Any

import redis
import sqlalchemy as sa

from models import CapacityOrg, Outbox, db_now
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


def candidates(settings: Settings, room: int, session: sa.orm.Session) -> list[Candidate]:
    """Each org with unsent starts, in order of name (pick breaks ties by that order). An
    org's `due` counts up to room + 1: more than room says some will be left unsent."""
    limit_rooms = _rooms_apply(settings)
    rows = session.execute(sa.text(_sql(session)), {"room": room + 1}).all()
    out = []
    for org, due, weight, limit, held in rows:
        cap = settings.org_capacity if limit is None else int(limit)
        out.append(Candidate(str(org), int(weight or FAIR_WEIGHT_DEFAULT), int(due),
                             max(0, cap - int(held)) if limit_rooms else -1))
    return sorted(out, key=lambda c: c.org)


def _rooms_apply(settings: Settings) -> bool:
    """Whether an org at its capacity limit gets no starts published (it would defer them)."""
    return settings.capacity_mode == "enforce" and settings.capacity_full == "defer"


def _claim(session: sa.orm.Session,
           wanted: Counter[str]) -> dict[str, list[tuple[str, str, list[Any]]]]:
    """Mark each org's first due unsent rows (by place) sent, in the pass's transaction."""
    out: dict[str, list[tuple[str, str, list[Any]]]] = {}
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
    """One pass: pick, claim, count in flight, publish. Returns starts published.

    The read and the claim share one transaction (async commit: a claim lost in a crash
    only sends its start again, which the attempt's fence turns into a no-op); the pick
    between them is one Redis call. Whether starts are left unsent is noted for `taken`."""
    limit = window(settings, _current_policy())
    if limit <= 0:
        return 0
    with session_scope(durable=False) as session:
        cands = candidates(settings, limit, session)
        if not cands:
            fair.note_backlog(False)
            return 0
        # Only the queues this fleet serves: a queue no worker takes must not close the window.
        picks = fair.pick(limit, publisher().waiting(start_queues(settings.served)),
                          [replace(c, due=min(c.due, limit)) for c in cands])
        claimed = _claim(session, Counter(picks)) if picks else {}
    # Left unsent: more due than claimed, or rows not due yet (an org counted with none due).
    fair.note_backlog(any(c.due == 0 or c.due > len(claimed.get(c.org, ())) for c in cands))
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
        fair.note_backlog(True)
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


def skip_queue(org: str, settings: Settings | None = None) -> bool:
    """Whether an admission's own start may go out at once, marked sent when written: only
    while the last pass left no start unsent and the window has room, so that it is what
    a pass would do (one candidate, picked, its org's tag moved on as a pass moves it).
    It saves the pass's transaction. False on any Redis or database error: the outbox."""
    settings = settings or get_settings()
    if _rooms_apply(settings):
        return False  # a full org's starts must wait unpublished: only a pass reads its room
    try:
        # The note first: it fails fast when Redis is away (before the bucket's inspect
        # would fall back to pacing in memory), and while starts wait it is all we ask.
        if store().backlog_noted():
            return False
        limit = window(settings, _current_policy())
        if limit <= 0:
            return False
        queued = publisher().waiting(start_queues(settings.served))
        one = Candidate(org, _weight(org), 1, -1)  # capacity is the start's own check
        return store().pick(limit, queued, [one], clear_only=True) == [org]
    except (redis.RedisError, sa.exc.SQLAlchemyError, StartRateReplyError,
            BrokerUnavailableError) as exc:
        log.warning("admission's start left to the relay (%s: %s)", type(exc).__name__, exc)
        return False


def send_skipped(message: Message, org: str) -> bool:
    """Publish a start that skipped the queue; on failure its row goes back to the outbox."""
    fair = store()
    try:
        fair.sent([(message[0], org)])
    except (redis.RedisError, StartRateReplyError) as exc:
        log.warning("fair relay not told of start %s (%s)", message[0], exc)
    if publish([message]):
        return True
    unmark([message[0]])
    note_backlog()
    with contextlib.suppress(redis.RedisError, StartRateReplyError):
        fair.taken(message[0])
    return False


def note_backlog() -> None:
    """A start row went back to the outbox (unsent or deferred): no admission skips the
    queue, and taken starts ask for passes, until a pass finds none left. Best effort: the
    sweep's pass notes it too."""
    with contextlib.suppress(redis.RedisError):
        store().note_backlog(True)


_weights: dict[str, tuple[float, int]] = {}


def _weight(org: str) -> int:
    """The org's weight, read at most once a POLICY_TTL_S per process."""
    now = time.monotonic()
    cached = _weights.get(org)
    if cached is not None and now - cached[0] < POLICY_TTL_S:
        return cached[1]
    with session_scope(readonly=True) as session:
        weight = session.scalar(sa.select(CapacityOrg.weight).where(CapacityOrg.org_id == org))
    if len(_weights) > 10_000:
        _weights.clear()  # bounded: a process that admits for many orgs
    _weights[org] = (now, int(weight or FAIR_WEIGHT_DEFAULT))
    return _weights[org][1]


def taken(task_id: str, settings: Settings | None = None) -> None:
    """A start message is past its permit (or ended before it): refill the window when it
    is half empty. Best effort: a lost report expires with the message's time in flight."""
    settings = settings or get_settings()
    try:
        done = store().taken(task_id)
    except (redis.RedisError, StartRateReplyError) as exc:
        log.warning("fair relay not told of start %s (%s)", task_id, exc)
        return
    # Nothing left unsent at the last pass: the next admission asks for its own pass.
    if done.counted and done.backlog and done.inflight * 2 <= done.window:
        pump(settings)
