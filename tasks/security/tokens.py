"""Capability tokens: signed, expiring, scoped to one launch of one attempt.

The worker mints them at launch and hands them to the runner through the sandbox; the
gateway verifies them on every request. A token names (org, run, generation, launch)
and the capabilities it grants; nothing else about the system is in it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import jwt

from tasks.errors import TokenExpiredError, TokenInvalidError

ALGORITHM = "HS256"
AUDIENCE = "playrun-gateway"

# Capabilities; each gateway action needs exactly one (tasks/gateway/actions/__init__.py).
RUN_HEARTBEAT = "run.heartbeat"
RUN_COMPLETE = "run.complete"
RUN_LEDGER_PROJECT = "run.ledger.project"
STEP_WRITE = "step.write"
SHEET_WRITE = "sheet.write"
SHEET_READ = "sheet.read"
RUN_EXIT = "run.exit"
# A warm sandbox's standby runner: it can ask for its assignment and nothing else.
POOL_STANDBY = "pool.standby"

RUNNER_CAPABILITIES = (RUN_HEARTBEAT, RUN_COMPLETE, STEP_WRITE, SHEET_WRITE, SHEET_READ)
# The narrow token that delivers progress: it can append to the ledger and nothing else.
PROJECTION_CAPABILITIES = (RUN_LEDGER_PROJECT,)
# The sandbox supervisor's token: it can report the runner's exit and nothing else (it is
# never in the play's environment).
EXIT_CAPABILITIES = (RUN_EXIT,)
# Each narrow capability comes alone in its token: a token with it can do nothing more.
STANDBY_CAPABILITIES = (POOL_STANDBY,)
_ALONE = (RUN_LEDGER_PROJECT, RUN_EXIT, POOL_STANDBY)


@dataclass(frozen=True)
class Grant:
    org_id: str
    run_id: str
    generation: int
    launch_id: str
    capabilities: frozenset[str]
    expires_at: float


def mint(*, org_id: str, run_id: str, generation: int, launch_id: str,
         capabilities: tuple[str, ...], ttl_s: float, secret: str,
         issued_at: float | None = None) -> str:
    """issued_at: epoch seconds by the database clock (a worker's own clock may be off)."""
    now = int(time.time() if issued_at is None else issued_at)
    claims = {
        "aud": AUDIENCE, "iat": now, "exp": now + int(ttl_s) + 1,
        "org": org_id, "run": run_id, "gen": generation, "lch": launch_id,
        "cap": list(capabilities),
    }
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def verify(token: str, secret: str) -> Grant:
    """The grant a token carries; TokenExpiredError or TokenInvalidError otherwise."""
    if not token or len(token) > 4096:
        raise TokenInvalidError("a capability token is required")
    try:
        claims = jwt.decode(token, secret, algorithms=[ALGORITHM], audience=AUDIENCE,
                            options={"require": ["exp", "iat", "aud"]})
    except jwt.ExpiredSignatureError:
        raise TokenExpiredError("the capability token has expired") from None
    except jwt.PyJWTError as exc:
        raise TokenInvalidError(f"the capability token is not valid: {exc}") from None
    try:
        caps = claims["cap"]
        grant = Grant(str(claims["org"]), str(claims["run"]), int(claims["gen"]),
                      str(claims["lch"]), frozenset(str(c) for c in caps),
                      float(claims["exp"]))
    except (KeyError, TypeError, ValueError):
        raise TokenInvalidError("the capability token lacks its scope") from None
    if not isinstance(caps, list) or not grant.capabilities:
        raise TokenInvalidError("the capability token grants nothing")
    for narrow in _ALONE:
        if narrow in grant.capabilities and len(grant.capabilities) != 1:
            raise TokenInvalidError(f"a token with {narrow} carries nothing else")
    return grant
