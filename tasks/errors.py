"""One exception root for playrun; every error carries a stable code (docs/contract.md)."""

from __future__ import annotations

from tasks import protocol


class PlayrunError(Exception):
    """Root of every error playrun raises on purpose."""

    code: str = "PLAYRUN_ERROR"
    # submit_runs: the index of the item that refused the batch (None elsewhere).
    item: int | None = None

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message or self.__class__.__doc__ or self.code)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class ConfigurationError(PlayrunError):
    """The configuration is unusable."""

    code = "CONFIG_INVALID"


class ProcessNotReadyError(PlayrunError):
    """A process a stack started exited, or did not say it was ready in time."""

    code = "PROCESS_NOT_READY"


class NoStackError(ConfigurationError):
    """No database is configured and no `playrun dev` runs."""

    code = "NO_STACK"


class AddressInUseError(ConfigurationError):
    """A server's listen address is taken by another process."""

    code = "ADDRESS_IN_USE"


class SheetNotFoundError(PlayrunError):
    """No such sheet for this org and play."""

    code = "SHEET_NOT_FOUND"


class SchemaNotCurrentError(PlayrunError):
    """The database is not at the Alembic head revision."""

    code = "SCHEMA_NOT_CURRENT"


class PlayNotFoundError(PlayrunError):
    """The play file does not exist."""

    code = protocol.PLAY_NOT_FOUND


class PlayInvalidError(PlayrunError):
    """The play cannot be loaded (syntax error, no run function)."""

    code = protocol.PLAY_INVALID


class InputInvalidError(PlayrunError):
    """An argument from app code or an operator is malformed, out of range or too large."""

    code = protocol.INPUT_INVALID


class IdempotencyConflictError(PlayrunError):
    """The idempotency key was used before for another play or input."""

    code = "IDEMPOTENCY_CONFLICT"

    def __init__(self, message: str = "", *, run_id: str) -> None:
        super().__init__(message)
        # The run the key already names: what a caller may want instead.
        self.run_id = run_id


class DocumentInvalidError(PlayrunError):
    """A document from a sandbox is not strict, bounded, storable JSON."""

    code = "DOCUMENT_INVALID"

    def __init__(self, message: str = "", *, reason: str = "invalid") -> None:
        super().__init__(message)
        # size, values, encoding, syntax, depth, number or type: what callers may report.
        self.reason = reason


class PolicyInvalidError(InputInvalidError):
    """The traffic policy request is not valid."""

    code = "POLICY_INVALID"


class PlacementInvalidError(InputInvalidError):
    """The placement policy request is not valid."""

    code = "PLACEMENT_INVALID"


class PlacementUnknownError(InputInvalidError):
    """No placement policy has this name."""

    code = "PLACEMENT_UNKNOWN"


class PlacementUnservedError(InputInvalidError):
    """The placement policy names a provider no worker serves."""

    code = "PLACEMENT_UNSERVED"


class PoolInvalidError(InputInvalidError):
    """The warm pool request is not valid (bounds, time to live, provider)."""

    code = "POOL_INVALID"


class PoolUnknownError(InputInvalidError):
    """No warm pool has this name."""

    code = "POOL_UNKNOWN"


class DurationInvalidError(InputInvalidError):
    """The duration is not like 30s, 10m, 1h30m or 2d."""

    code = "DURATION_INVALID"


class StartRateReplyError(PlayrunError):
    """A start-rate script answered something other than its documented reply."""

    code = "START_RATE_REPLY_INVALID"


class GatewayBudgetReplyError(PlayrunError):
    """A gateway budget script answered something other than its documented reply."""

    code = "GATEWAY_BUDGET_REPLY_INVALID"


class DatabaseUnavailableError(PlayrunError):
    """The database did not answer (down, unreachable, or a path that cannot be opened)."""

    code = "DATABASE_UNAVAILABLE"


class BrokerUnavailableError(PlayrunError):
    """The Celery broker (Redis, or RabbitMQ) did not answer."""

    code = "BROKER_UNAVAILABLE"


class RunNotFoundError(PlayrunError):
    """No run has this id."""

    code = "RUN_NOT_FOUND"


class RunIdAmbiguousError(InputInvalidError):
    """A run-id prefix names more than one run."""

    code = "RUN_ID_AMBIGUOUS"


class PruneExportError(PlayrunError):
    """`playrun prune --export`: the directory cannot be written; nothing was deleted."""

    code = "PRUNE_EXPORT_FAILED"


class RunWaitTimeoutError(PlayrunError):
    """The run did not reach a terminal outcome within the wait timeout."""

    code = "WAIT_TIMEOUT"


class FenceLostError(PlayrunError):
    """The attempt no longer holds the current, unexpired lease; nothing was written."""

    code = protocol.FENCE_LOST


class CapacityExceededError(PlayrunError):
    """This organization's execution concurrency limit is currently full."""

    code = "SANDBOX_CAPACITY_EXCEEDED"


class RuntimeSheetWriteIntentUnavailableError(PlayrunError):
    """The gateway does not offer the write-intent sheet start (never fall back to the legacy)."""

    code = protocol.RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE


class RuntimeSheetAttemptSupersededError(PlayrunError):
    """A newer write version owns this writer's sheet rows: the writer must stop."""

    code = protocol.RUNTIME_SHEET_ATTEMPT_SUPERSEDED


class SheetWriteIntentInvalidError(PlayrunError):
    """The stored write intent is not this run's admitted intent (wrong run, status or kind)."""

    code = "RUNTIME_SHEET_WRITE_INTENT_INVALID"


class SheetWriteVersionMismatchError(PlayrunError):
    """The caller's write version is not the one this run admitted for the table."""

    code = "RUNTIME_SHEET_WRITE_VERSION_MISMATCH"


class GatewayError(PlayrunError):
    """The gateway refused the request."""

    code = protocol.GATEWAY_BAD_REQUEST
    status = 400


class GatewayBadRequestError(GatewayError):
    """The request is malformed."""


class GatewayBodyTooLargeError(GatewayError):
    """The request body is larger than the gateway accepts."""

    code = protocol.GATEWAY_BODY_TOO_LARGE
    status = 413


class GatewayRateLimitedError(GatewayError):
    """The attempt sent more than its budget allows; retry after the time given."""

    code = "GATEWAY_RATE_LIMITED"
    status = 429

    def __init__(self, message: str = "", *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class GatewayUnknownActionError(GatewayError):
    """The gateway does not know this action."""

    code = protocol.GATEWAY_UNKNOWN_ACTION
    status = 404


class GatewayUnknownFieldError(GatewayError):
    """The action carries a field the gateway does not know."""

    code = "GATEWAY_UNKNOWN_FIELD"
    status = 422


class TokenInvalidError(GatewayError):
    """The capability token is missing, forged or malformed."""

    code = protocol.GATEWAY_TOKEN_INVALID
    status = 401


class TokenExpiredError(GatewayError):
    """The capability token has expired."""

    code = protocol.GATEWAY_TOKEN_EXPIRED
    status = 401


class CapabilityDeniedError(GatewayError):
    """The token does not grant this action."""

    code = protocol.GATEWAY_CAPABILITY_DENIED
    status = 403


class GatewayAbuseError(GatewayError):
    """The gateway failed this attempt for sustained refused requests; it serves it no more."""

    code = protocol.GATEWAY_ABUSE
    status = 403


class ReceiptNotHeldError(GatewayError):
    """This attempt does not hold the work receipt it tries to settle."""

    code = protocol.RECEIPT_NOT_HELD
    status = 409


class StepOutputInvalidError(GatewayError):
    """A step's output is not storable JSON or is larger than a receipt keeps."""

    code = protocol.OUTPUT_INVALID
    status = 400
