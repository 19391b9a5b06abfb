"""The host and the runner in a sandbox speak one protocol (tasks/protocol.py): nothing that
crosses the sandbox's edge is spelled twice, and the files the host uploads are the ones the
runner and the supervisor import."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from tasks import constants, errors, protocol
from tasks.acquisition.sandbox import RUNNER_SOURCES, runner_files
from tasks.execution import runner_sheetrows, runner_steps
from tasks.gateway.actions import ACTIONS
from tasks.sandbox.local.records import SUPERVISOR_FILES
from tasks.settlement import outcome

TASKS = Path(protocol.__file__).parent
CODE = re.compile(r"[A-Z][A-Z0-9_]{3,}")


def sandbox_imports(source: bytes) -> set[str]:
    """Top-level names a file imports, outside the host's `tasks.` branch."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - {"tasks"}


def test_every_code_a_runner_fails_with_is_kept_by_the_host() -> None:
    assert protocol.RUNNER_CODES <= outcome.KNOWN_CODES
    for code in protocol.RUNNER_CODES:
        kept = outcome.from_document({"status": "failed", "code": code, "error": "x"})
        assert kept.code == code
    assert outcome.from_document({"status": "failed", "code": "MADE_UP"}).code == "PLAY_ERROR"


def test_the_runner_and_supervisor_files_spell_no_code_or_action_of_their_own() -> None:
    shared = {v for v in vars(protocol).values() if isinstance(v, str)}
    sandbox_side = [*RUNNER_SOURCES, *(f"sandbox/{name}" for name in SUPERVISOR_FILES)]
    for path in sandbox_side:
        if path.endswith(("protocol.py", protocol.PROTOCOL_FILE)):
            continue
        tree = ast.parse((TASKS / path).read_bytes())
        literals = {
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        restated = {s for s in literals & shared if CODE.fullmatch(s) or s in protocol.ACTIONS}
        assert restated == set(), f"{path} restates {sorted(restated)}: use the protocol's"


def test_the_hosts_limits_and_codes_are_the_protocols() -> None:
    for name in (
        "MAX_OUTPUT_BYTES",
        "MAX_EVENT_BYTES",
        "MAX_STEP_KEY_CHARS",
        "MAX_STEP_OUTPUT_BYTES",
        "MAX_STEP_TTL_S",
        "SHEET_MAX_KEY_BYTES",
        "SHEET_MAX_ROW_BYTES",
        "SHEET_MAX_PAGE_ROWS",
        "STEP_CODES",
        "RESULT_FILE",
        "EVENTS_FILE",
        "PLAY_FILE",
        "INPUT_FILE",
        "RUNNER_FILE",
    ):
        assert getattr(constants, name) == getattr(protocol, name), name
    assert runner_steps.MAX_KEY_CHARS == constants.MAX_STEP_KEY_CHARS
    assert runner_steps.MAX_OUTPUT_BYTES == constants.MAX_STEP_OUTPUT_BYTES
    assert runner_sheetrows.MAX_ROW_BYTES == constants.SHEET_MAX_ROW_BYTES
    assert outcome.MAX_ERROR_CHARS == protocol.MAX_ERROR_CHARS


def test_the_stop_codes_are_the_gateways_refusals() -> None:
    raised = {
        cls.code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.PlayrunError)
    }
    assert raised >= protocol.STOP_CODES
    assert errors.CapabilityDeniedError.code in protocol.STOP_CODES
    assert errors.GatewayUnknownActionError.code == protocol.GATEWAY_UNKNOWN_ACTION


def test_the_gateway_serves_exactly_the_protocols_actions() -> None:
    assert set(ACTIONS) == protocol.ACTIONS


def test_the_host_uploads_every_file_the_runner_imports_and_nothing_else() -> None:
    files = runner_files()
    assert protocol.RUNNER_FILE in files and protocol.PROTOCOL_FILE in files
    flat = {name.removesuffix(".py") for name in files}
    imported: set[str] = set()
    for name, source in files.items():
        outside = sandbox_imports(source) - set(sys.stdlib_module_names)
        assert outside <= flat, f"{name} imports {sorted(outside - flat)}, not uploaded"
        imported |= outside
    assert flat - {"runner"} == imported  # every uploaded module is used


def test_the_supervisors_files_import_only_each_other_and_the_standard_library() -> None:
    assert "supervisor.py" in SUPERVISOR_FILES
    assert SUPERVISOR_FILES[protocol.PROTOCOL_FILE] == Path(protocol.__file__).read_bytes()
    flat = {name.removesuffix(".py") for name in SUPERVISOR_FILES}
    for name, source in SUPERVISOR_FILES.items():
        outside = sandbox_imports(source) - set(sys.stdlib_module_names)
        assert outside <= flat, f"{name} imports {sorted(outside - flat)}, not copied"


def test_every_file_in_tasks_stays_short() -> None:
    long = {
        str(p.relative_to(TASKS)): n
        for p in TASKS.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert long == {}
