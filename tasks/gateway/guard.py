"""The gateway's side of a refused request of a valid token: counted by org and code,
recorded in the ledger within its bound (refusals.py), and past the attempt's hard budget
(fleet-wide in Redis: fleet/) the attempt is failed GATEWAY_ABUSE, settled and released as
a pushed terminal is.

Database work runs in the thread pool, never on the event loop, and only when the tally
says a row is due: a flood of refusals costs no write per request.
"""

from __future__ import annotations

import logging
import time

from starlette.concurrency import run_in_threadpool

from tasks.constants import GATEWAY_ABUSE
from tasks.errors import FenceLostError, GatewayAbuseError, GatewayError
from tasks.gateway import refusals
from tasks.gateway.actions import complete
from tasks.gateway.actions.base import Context
from tasks.observe import metrics
from tasks.security.tokens import Grant
from tasks.settlement.outcome import Outcome

log = logging.getLogger("playrun.gateway")


async def refused(grant: Grant, exc: GatewayError, ctx: Context) -> GatewayError:
    """Count a refusal made before any action ran; the answer is `exc`, or
    GatewayAbuseError when this refusal failed the attempt."""
    metrics.gateway_refusal(grant.org_id, exc.code)
    if isinstance(exc, GatewayAbuseError):
        # Failed (another process may have failed it): refused here without Redis from now.
        ctx.refusals.failed((grant.run_id, grant.generation), grant.expires_at - time.time())
        return exc
    verdict = await ctx.refusals.refuse((grant.run_id, grant.generation), exc.code,
                                        keep_s=grant.expires_at - time.time())
    if verdict.flush is not None:
        await run_in_threadpool(_record, grant, verdict.flush, ctx)
    if verdict.tripped:
        await run_in_threadpool(_fail, grant, verdict.totals, ctx)
    # Failed by this refusal, or before it (by another gateway process): refused as such.
    return GatewayAbuseError(refusals.ABUSE_MESSAGE) if verdict.failed else exc


def _record(grant: Grant, flush: refusals.Flush, ctx: Context) -> None:
    try:
        if not refusals.record(grant, flush):
            ctx.refusals.close((grant.run_id, grant.generation))
    except Exception as exc:  # noqa: BLE001 - a diagnostic row must never fail the answer
        log.warning("refusals of run %s not recorded: %s", grant.run_id, exc)


def _fail(grant: Grant, totals: dict[str, int], ctx: Context) -> None:
    counted = ", ".join(f"{code} {n}" for code, n in sorted(totals.items(), key=lambda t: -t[1]))
    window = ctx.settings.gateway_abuse_window_s
    outcome = Outcome.failed(GATEWAY_ABUSE, (
        f"the gateway refused {sum(totals.values())} requests of this attempt ({counted}), "
        f"more than PLAYRUN_GATEWAY_ABUSE_REFUSALS "
        f"({ctx.settings.gateway_abuse_refusals} per {window:g} s) allows"))
    try:
        settled = complete.settle(grant, outcome, ctx, reason=GATEWAY_ABUSE)
    except FenceLostError:
        return  # the attempt had ended already: nothing of it is left to fail
    except Exception as exc:  # noqa: BLE001 - its requests are refused all the same
        log.warning("run %s could not be failed %s: %s", grant.run_id, GATEWAY_ABUSE, exc)
        return
    if settled.won:
        log.warning("run %s (org %s) failed %s: %s", grant.run_id, grant.org_id,
                    GATEWAY_ABUSE, outcome.error)
