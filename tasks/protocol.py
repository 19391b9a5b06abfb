"""What the host and the runner in a sandbox agree on: file names, codes, limits, actions.

Standard library only and no imports of playrun: the host imports it as tasks.protocol, and
each sandbox gets a copy as playrun_protocol.py beside runner.py (tasks/acquisition/sandbox.py
uploads it), so a runner speaks exactly the protocol of the release that started it.
"""

from __future__ import annotations

from typing import Final

# Files in the sandbox's directory: what the host uploads and what the runner leaves.
PLAY_FILE: Final = "play.py"
INPUT_FILE: Final = "input.json"
RESULT_FILE: Final = "result.json"
EVENTS_FILE: Final = "events.jsonl"
STDOUT_FILE: Final = "stdout.log"
RUNNER_FILE: Final = "runner.py"
RUNNER_CONTEXT_FILE: Final = "playrun_context.py"
RUNNER_CLIENT_FILE: Final = "playrun_client.py"
RUNNER_HTTP_FILE: Final = "playrun_http.py"
RUNNER_STEPS_FILE: Final = "playrun_steps.py"
RUNNER_SHEETS_FILE: Final = "playrun_sheets.py"
RUNNER_SHEETROWS_FILE: Final = "playrun_sheetrows.py"
PROTOCOL_FILE: Final = "playrun_protocol.py"
RUNNER_STANDBY_FILE: Final = "playrun_standby.py"

# Codes a runner fails a run with (its result file's `code`).
PLAY_NOT_FOUND: Final = "PLAY_NOT_FOUND"
PLAY_INVALID: Final = "PLAY_INVALID"
PLAY_ERROR: Final = "PLAY_ERROR"
OUTPUT_INVALID: Final = "OUTPUT_INVALID"
INPUT_INVALID: Final = "INPUT_INVALID"
RUN_TIMEOUT: Final = "RUN_TIMEOUT"
# ctx.step's (the run fails with the same code unless the play catches it).
STEP_KEY_INVALID: Final = "STEP_KEY_INVALID"
STEP_INVALID: Final = "STEP_INVALID"
STEP_RECURSIVE: Final = "STEP_RECURSIVE"
STEP_UNAVAILABLE: Final = "STEP_UNAVAILABLE"
STEP_REFUSED: Final = "STEP_REFUSED"
RECEIPT_NOT_HELD: Final = "RECEIPT_NOT_HELD"  # also the gateway's refusal of a step
STEP_CODES: Final = frozenset(
    {
        STEP_KEY_INVALID,
        STEP_INVALID,
        STEP_RECURSIVE,
        STEP_UNAVAILABLE,
        STEP_REFUSED,
        RECEIPT_NOT_HELD,
    }
)
# Runtime sheets: a writer superseded by a newer write version, and a gateway without the
# write-intent start.
RUNTIME_SHEET_ATTEMPT_SUPERSEDED: Final = "RUNTIME_SHEET_ATTEMPT_SUPERSEDED"
RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE: Final = "RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE"
RUNNER_CODES: Final = (
    frozenset(
        {
            PLAY_INVALID,
            PLAY_ERROR,
            OUTPUT_INVALID,
            INPUT_INVALID,
            RUN_TIMEOUT,
            RUNTIME_SHEET_ATTEMPT_SUPERSEDED,
            RUNTIME_SHEET_WRITE_INTENT_UNAVAILABLE,
        }
    )
    | STEP_CODES
)

# The gateway's refusals the runner tells apart (tasks/errors.py raises them).
FENCE_LOST: Final = "FENCE_LOST"
GATEWAY_BAD_REQUEST: Final = "GATEWAY_BAD_REQUEST"
GATEWAY_BODY_TOO_LARGE: Final = "GATEWAY_BODY_TOO_LARGE"
GATEWAY_UNKNOWN_ACTION: Final = "GATEWAY_UNKNOWN_ACTION"
GATEWAY_TOKEN_INVALID: Final = "GATEWAY_TOKEN_INVALID"
GATEWAY_TOKEN_EXPIRED: Final = "GATEWAY_TOKEN_EXPIRED"
GATEWAY_CAPABILITY_DENIED: Final = "GATEWAY_CAPABILITY_DENIED"
# The gateway failed the attempt: it sent far more refused requests than a runner does.
GATEWAY_ABUSE: Final = "GATEWAY_ABUSE"
# Refusals after which this runner no longer owns its attempt, whatever it asked: it stops.
# Every runner token carries every runner capability, so a denial means it is not ours.
STOP_CODES: Final = frozenset(
    {
        FENCE_LOST,
        GATEWAY_TOKEN_EXPIRED,
        GATEWAY_TOKEN_INVALID,
        GATEWAY_CAPABILITY_DENIED,
        GATEWAY_ABUSE,
    }
)

# Gateway actions (POST /v1/runtime {"action": ...}).
ACTION_HEARTBEAT: Final = "heartbeat"
ACTION_APPEND_EVENTS: Final = "append_run_events"
ACTION_COMPLETE: Final = "complete"
ACTION_STEP_CLAIM: Final = "step_claim"
ACTION_STEP_COMPLETE: Final = "step_complete"
ACTION_STEP_FAIL: Final = "step_fail"
ACTION_SHEET_START: Final = "sheet_start"  # legacy: no runner of this release sends it
ACTION_SHEET_START_WITH_INTENT: Final = "sheet_start_with_intent"
ACTION_SHEET_WRITE: Final = "sheet_write"
ACTION_SHEET_READ: Final = "sheet_read"
# Sent by a sandbox's supervisor or boot script, never the runner: the runner's process ended.
ACTION_EXITED: Final = "exited"
# A warm sandbox's standby runner waits for its assignment (a run's play, input and tokens).
ACTION_STANDBY: Final = "standby"
ACTIONS: Final = frozenset(
    {
        ACTION_HEARTBEAT,
        ACTION_APPEND_EVENTS,
        ACTION_COMPLETE,
        ACTION_STEP_CLAIM,
        ACTION_STEP_COMPLETE,
        ACTION_STEP_FAIL,
        ACTION_SHEET_START,
        ACTION_SHEET_START_WITH_INTENT,
        ACTION_SHEET_WRITE,
        ACTION_SHEET_READ,
        ACTION_EXITED,
        ACTION_STANDBY,
    }
)
GATEWAY_PATH: Final = "/v1/runtime"

# Limits both sides enforce: the runner checks first, with a clear error; the host
# re-checks everything (a runner is untrusted).
MAX_OUTPUT_BYTES: Final = 1024 * 1024  # a run's output, as JSON
MAX_EVENT_BYTES: Final = 16 * 1024  # one progress event
MAX_ERROR_CHARS: Final = 8 * 1024  # a failed run's error text
MAX_STEP_KEY_CHARS: Final = 1024
MAX_STEP_OUTPUT_BYTES: Final = 256 * 1024
MAX_STEP_TTL_S: Final = 10 * 365 * 86400
SHEET_MAX_PAGE_ROWS: Final = 2000
SHEET_MAX_KEY_BYTES: Final = 1024
SHEET_MAX_ROW_BYTES: Final = 64 * 1024
