"""A batch of releases on PostgreSQL in two statements, whatever its size: one read of the
holders' sandboxes, the provider deletes, then one statement that marks every deleted
sandbox and releases the leases of every holder without work receipts, with their events.

Per holder that was two statements and two commits (tasks/release/sandboxes.py); the
gateway's batches (tasks/gateway/releases.py) now share them. The write is the one-holder
statement (after_delete.py) for many: each holder's rows are matched by its own run,
generation and holder token, and the run rows are locked first, in id order. A holder
that is not the common case (no sandbox or several, a delete that failed, receipts held)
goes the one-holder way (tasks/release/attempt.py), as before; a failed delete leaves the
holder's slot taken for the reaper's retry, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tasks.constants import LEASE_HELD, RECEIPT_HELD, EventKind, LeaseState, SandboxState
from tasks.release.after_delete import mark_and_release
from tasks.release.receipts import release_receipts
from tasks.release.sandboxes import deleted_at_provider
from tasks.store.db import driver_cursor, sql_list

log = logging.getLogger("playrun.release")

Holder = tuple[str, int, str]  # (run id, generation, holder token)
Sandbox = tuple[str, str, str]  # (resource id, provider, sandbox id)

_INPUT = """
    SELECT * FROM unnest(%(runs)s::varchar[], %(gens)s::integer[], %(tokens)s::varchar[])
        WITH ORDINALITY AS i(run_id, gen, token, ord)"""

_UNDELETED = f"""
WITH input AS ({_INPUT})
SELECT i.ord, r.id, r.provider, r.sandbox_id FROM input i
JOIN runtime_resources r ON r.run_id = i.run_id AND r.generation = i.gen
  AND r.holder_token = i.token AND r.state <> '{SandboxState.DELETED}'
"""

# Committed durably, as the one-holder statement is: the slots it frees go to other runs.
_MARK_AND_RELEASE = f"""
WITH input AS (
    SELECT * FROM unnest(%(runs)s::varchar[], %(gens)s::integer[], %(tokens)s::varchar[],
                         %(rids)s::varchar[], %(sids)s::varchar[])
        WITH ORDINALITY AS i(run_id, gen, token, rid, sid, ord)
), run AS (
    SELECT id FROM runs WHERE id IN (SELECT run_id FROM input) ORDER BY id FOR UPDATE
), receipts AS (
    SELECT i.ord, EXISTS (
        SELECT 1 FROM work_receipts w
        WHERE w.owner_run_id = i.run_id AND w.owner_generation = i.gen
          AND w.status IN ({sql_list(RECEIPT_HELD)})) AS held
    FROM input i
), gone AS (
    UPDATE runtime_resources AS r SET state = '{SandboxState.DELETED}',
        deleted_at = clock_timestamp(), updated_at = clock_timestamp()
    FROM input i JOIN run ON run.id = i.run_id
    WHERE r.id = i.rid AND r.run_id = i.run_id AND r.state <> '{SandboxState.DELETED}'
    RETURNING r.id
), released AS (
    UPDATE capacity_leases AS l SET state = '{LeaseState.RELEASED}',
        released_at = clock_timestamp()
    FROM input i JOIN run ON run.id = i.run_id JOIN receipts c ON c.ord = i.ord
    WHERE NOT c.held AND l.run_id = i.run_id AND l.generation = i.gen
      AND l.state IN ({sql_list(LEASE_HELD)}) AND l.holder_token = i.token
    RETURNING l.id, l.run_id, l.generation
), events AS (
    INSERT INTO run_events (run_id, generation, kind, data)
    SELECT e.run_id, e.gen, e.kind, e.data FROM (
        SELECT i.ord, 0 AS n, 0::bigint AS k, i.run_id, i.gen,
               '{EventKind.SANDBOX_DELETED}' AS kind,
               jsonb_build_object('sandbox_id', i.sid) AS data
        FROM input i JOIN gone g ON g.id = i.rid
        UNION ALL
        SELECT i.ord, 1, row_number() OVER (), i.run_id, i.gen,
               '{EventKind.CAPACITY_RELEASED}', jsonb_build_object('lease_id', x.id)
        FROM input i JOIN released x ON x.run_id = i.run_id AND x.generation = i.gen
    ) e ORDER BY e.ord, e.n, e.k
)
SELECT c.ord FROM receipts c WHERE c.held ORDER BY c.ord
"""


def release_batch(holders: Sequence[Holder], one: Callable[[str, int, str], None],
                  known: Mapping[Holder, Sandbox] | None = None) -> None:
    """Release every holder's sandbox and leases; `one(run_id, generation, token)` releases
    a holder the one-holder way. `known`: holders whose only sandbox the terminal's write
    read; the others are read here. Raises only from that read, before any delete (the
    caller then goes the one-holder way for all)."""
    holders = list(dict.fromkeys(holders))  # a holder twice in one batch: released once
    known = known or {}
    found = _undeleted([h for h in holders if h not in known])
    common: list[tuple[Holder, Sandbox]] = []
    for holder in holders:
        sandboxes = [known[holder]] if holder in known else found.get(holder, [])
        if len(sandboxes) != 1:
            one(*holder)  # none or several: as before
        elif deleted_at_provider(*sandboxes[0], holder[0]):
            common.append((holder, sandboxes[0]))
        else:  # the slot stays taken while the sandbox may exist; the reaper retries
            _receipts(holder)
    if not common:
        return
    try:
        with driver_cursor() as cur:
            cur.execute(_MARK_AND_RELEASE, {
                "runs": [h[0] for h, _ in common], "gens": [h[1] for h, _ in common],
                "tokens": [h[2] for h, _ in common], "rids": [s[0] for _, s in common],
                "sids": [s[2] for _, s in common]})
            held = [common[int(row[0]) - 1][0] for row in cur.fetchall()]
    except Exception:  # each holder's own statement, as before
        log.exception("the batch's release of %d holders failed; one by one", len(common))
        held = [holder for holder, sandbox in common if _mark_one(holder, sandbox)]
    for holder in held:
        # Receipts held: the leases were left, so the receipts go back first (attempt.py).
        one(*holder)


def _undeleted(holders: list[Holder]) -> dict[Holder, list[Sandbox]]:
    """Each holder's undeleted sandboxes, in one read."""
    if not holders:
        return {}
    params: dict[str, Any] = {"runs": [h[0] for h in holders], "gens": [h[1] for h in holders],
                              "tokens": [h[2] for h in holders]}
    found: dict[Holder, list[Sandbox]] = {}
    with driver_cursor() as cur:
        cur.execute(_UNDELETED, params)
        for ord_, rid, prov, sid in cur.fetchall():
            found.setdefault(holders[int(ord_) - 1], []).append((rid, prov, sid))
    return found


def _mark_one(holder: Holder, sandbox: Sandbox) -> bool:
    """The one-holder statement for a deleted sandbox; True if the holder holds receipts."""
    run_id, generation, token = holder
    try:
        with driver_cursor() as cur:
            return mark_and_release(cur, run_id=run_id, generation=generation, token=token,
                                    resource_id=sandbox[0], sandbox_id=sandbox[2]).receipts_held
    except Exception:  # the reaper releases what is left
        log.exception("releasing run %s gen %s failed", run_id, generation)
        return False


def _receipts(holder: Holder) -> None:
    try:
        release_receipts(holder[0], holder[1])  # only if that attempt can no longer write
    except Exception:  # the reaper releases what is left
        log.exception("releasing the receipts of run %s gen %s failed", holder[0], holder[1])
