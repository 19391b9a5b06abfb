"""Everything an attempt holder held is given back here, for every terminal path.

Rows carry the lease token of the holder that owns them (`holder_token`): a deferral
resumes the same generation under a new token, and the reaper re-tags the rows of an
attempt it adopts, so a release by token never touches the next holder's sandbox or slot.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from tasks.constants import MAX_LEASE_TOKEN_CHARS, RELEASE_BATCH_MAX, SANDBOX_FIELD_CHARS
from tasks.errors import InputInvalidError, PlayrunError
from tasks.parse.checks import check_run_id
from tasks.release.batch import Holder, Sandbox, release_batch
from tasks.release.capacity import release_lease
from tasks.release.receipts import release_receipts
from tasks.release.sandboxes import Released, release_sandboxes
from tasks.store.db import get_engine

log = logging.getLogger("playrun.release")


def release_attempt(run_id: str, generation: int, token: str,
                    sandbox: Sandbox | None = None) -> None:
    """Delete the holder's sandboxes, release the receipts its ended attempt still holds,
    then its capacity lease. `sandbox`: its only one, as the terminal's write read it.
    Never raises."""
    try:
        released = release_sandboxes(run_id, generation, token, with_leases=True,
                                     known=sandbox)
    except Exception:
        log.exception("releasing sandboxes of run %s gen %s failed", run_id, generation)
        released = Released(1)
    if released.leases_released:
        return  # no receipts held, and the leases went with the sandbox's mark
    left = released.left
    try:
        release_receipts(run_id, generation)  # only if that attempt can no longer write
    except Exception:
        log.exception("releasing the receipts of run %s gen %s failed", run_id, generation)
    if left:
        # The slot stays taken while a sandbox may still exist; the reaper retries.
        return
    try:
        release_lease(run_id, generation, token)
    except Exception:
        log.exception("releasing the capacity lease of run %s gen %s failed", run_id, generation)


def holder_of(value: Any) -> tuple[Holder, Sandbox | None]:
    """One [run_id, generation, token(, [resource id, provider, sandbox id])] of a
    release_attempts message, or InputInvalidError."""
    if not isinstance(value, (list, tuple)) or len(value) not in (3, 4):
        raise InputInvalidError("a holder is [run_id, generation, token(, sandbox)]")
    run_id, generation, token = value[:3]
    sandbox = _sandbox_of(value[3]) if len(value) == 4 else None
    if isinstance(generation, bool) or not isinstance(generation, int) or not (
            0 < generation < 2**31):
        raise InputInvalidError("generation must be a positive integer")
    if not isinstance(token, str) or len(token) > MAX_LEASE_TOKEN_CHARS:
        raise InputInvalidError("token must be a short string")
    try:
        return (check_run_id(run_id), generation, token), sandbox
    except PlayrunError as exc:
        raise InputInvalidError(exc.message) from None


def _sandbox_of(value: Any) -> Sandbox:
    if not isinstance(value, (list, tuple)) or len(value) != 3 or not all(
            isinstance(v, str) and 0 < len(v) <= limit
            for v, limit in zip(value, SANDBOX_FIELD_CHARS, strict=True)):
        raise InputInvalidError("a holder's sandbox is [resource id, provider, sandbox id]")
    return value[0], value[1], value[2]


def release_attempts(holders: Any) -> int:
    """release_attempt for each well-formed holder, in order; returns how many. A malformed
    one is logged with its code and skipped (a retry would not mend it; the reaper
    releases whatever is left held)."""
    if not isinstance(holders, Sequence) or isinstance(holders, (str, bytes)):
        log.error("release_attempts wants a list of holders, not %s", type(holders).__name__)
        return 0
    done: list[Holder] = []
    known: dict[Holder, Sandbox] = {}
    for index, value in enumerate(holders):
        if index >= RELEASE_BATCH_MAX:
            log.error("release_attempts: %d holders past the limit of %d left to the reaper",
                      len(holders) - index, RELEASE_BATCH_MAX)
            break
        try:
            holder, sandbox = holder_of(value)
        except InputInvalidError as exc:
            log.error("release_attempts: holder %d skipped: %s", index, exc)
            continue
        done.append(holder)
        if sandbox is not None:
            known[holder] = sandbox
    if len(done) > 1 and get_engine().dialect.name == "postgresql":
        try:
            release_batch(done, release_attempt, known)
            return len(done)
        except Exception:  # its first read failed: nothing was done yet
            log.exception("the batch's read failed; releasing %d holders one by one", len(done))
    for holder in done:
        release_attempt(*holder, known.get(holder))  # used on PostgreSQL only
    return len(done)
