"""What Flower (and any other monitor) is shown of a task's arguments.

Celery puts `argsrepr`/`kwargsrepr` in every message's headers and workers report them
in task events. Set here for every playrun task at publish time (one signal, so
retries, the relay, deferrals and the reaper are all covered): named arguments that
say which run, and never a lease or holder token. Workers answer the inspect commands
(`active`, `reserved`, `scheduled`, `query_task`, which Flower's worker pages ask) with
the real arguments; they are re-registered here to answer with the same shown form.
"""

from __future__ import annotations

from typing import Any

from celery.signals import before_task_publish
from celery.worker.control import Panel, inspect_command

from tasks.constants import (
    TASK_CANCEL_ATTEMPT,
    TASK_INSPECT_ATTEMPT,
    TASK_RELEASE_ATTEMPT,
    TASK_RELEASE_ATTEMPTS,
    TASK_START_ATTEMPT,
)

HIDDEN = None
# Argument names by position; HIDDEN ones are left out of what is shown.
_SHOWN: dict[str, tuple[str | None, ...]] = {
    TASK_START_ATTEMPT: ("run_id", "provider"),
    TASK_RELEASE_ATTEMPT: ("run_id", "generation", HIDDEN),
    TASK_INSPECT_ATTEMPT: ("run_id", "generation", HIDDEN, "reported"),
    TASK_CANCEL_ATTEMPT: ("run_id",),
}
_MAX_VALUE_CHARS = 64
_MAX_SHOWN_RUNS = 10


def shown(task: str, args: Any) -> str:
    """`run_id=..., generation=...` for a known task; for any other one, only how many
    arguments it has (a task added later shows nothing it might not want shown)."""
    if not isinstance(args, (list, tuple)):
        return ""
    if task == TASK_RELEASE_ATTEMPTS:
        return _holders_shown(args[0] if args else None)
    names = _SHOWN.get(task)
    if names is None:
        return f"({len(args)} args)" if args else ""
    parts = [f"{name}={str(value)[:_MAX_VALUE_CHARS]}"
             for name, value in zip(names, args, strict=False) if name is not HIDDEN]
    return ", ".join(parts)


def _holders_shown(holders: Any) -> str:
    """release_attempts' [[run_id, generation, token], ...]: the runs, never a token."""
    if not isinstance(holders, (list, tuple)):
        return ""
    runs = [str(h[0])[:_MAX_VALUE_CHARS] for h in holders[:_MAX_SHOWN_RUNS]
            if isinstance(h, (list, tuple)) and h]
    more = f" (+{len(holders) - _MAX_SHOWN_RUNS} more)" if len(holders) > _MAX_SHOWN_RUNS else ""
    return f"runs={','.join(runs)}{more}"


@before_task_publish.connect
def _redact(headers: dict[str, Any] | None = None, body: Any = None, **_kwargs: Any) -> None:
    if headers is None or "task" not in headers:
        return  # protocol 1 message: not sent by playrun
    args = body[0] if isinstance(body, (list, tuple)) and body else ()
    headers["argsrepr"] = shown(str(headers["task"]), args)
    headers["kwargsrepr"] = "{}" if not (isinstance(body, (list, tuple)) and len(body) > 1
                                        and body[1]) else "{...}"


def _redacted(info: Any) -> Any:
    if isinstance(info, dict) and "name" in info:
        return {**info, "args": shown(str(info["name"]), info.get("args")), "kwargs": "{}"}
    return info


_BUILTIN = {name: Panel.data[name] for name in ("active", "reserved", "scheduled", "query_task")}


@inspect_command(alias="dump_active")
def active(state: Any, **kwargs: Any) -> list[Any]:
    """List of tasks currently being executed (arguments as shown to monitors)."""
    return [_redacted(i) for i in _BUILTIN["active"](state, **kwargs)]


@inspect_command(alias="dump_reserved")
def reserved(state: Any, **kwargs: Any) -> list[Any]:
    """List of currently reserved tasks (arguments as shown to monitors)."""
    return [_redacted(i) for i in _BUILTIN["reserved"](state, **kwargs)]


@inspect_command(alias="dump_schedule")
def scheduled(state: Any, **kwargs: Any) -> list[Any]:
    """List of currently scheduled ETA/countdown tasks (arguments as shown to monitors)."""
    return [{**e, "request": _redacted(e.get("request"))} if isinstance(e, dict) else e
            for e in _BUILTIN["scheduled"](state, **kwargs)]


@inspect_command(variadic="ids", signature="[id1 [id2 [... [idN]]]]")
def query_task(state: Any, ids: Any, **kwargs: Any) -> dict[str, Any]:
    """Query for task information by id (arguments as shown to monitors)."""
    return {task_id: (found[0], _redacted(found[1]))
            for task_id, found in _BUILTIN["query_task"](state, ids, **kwargs).items()}
