"""What the CLI prints: ledger lines that never wrap mid-field, times in UTC with their
zone, a live status line only on a terminal, and one coded line for every error."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape

from tasks.errors import BrokerUnavailableError, DatabaseUnavailableError, PlayrunError
from tasks.store.ledger import Event

_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]*@")


def console(*, stderr: bool = False) -> Console:
    """soft_wrap: a line longer than the terminal (or than 80 columns when piped) is left
    whole for the terminal to fold, never broken inside a field by rich."""
    return Console(stderr=stderr, soft_wrap=True, highlight=False)


def utc_iso(at: datetime | None) -> str:
    """ISO 8601 in UTC with a `Z`: the same instant reads the same on every machine."""
    if at is None:
        return "-"
    if at.tzinfo is None:  # the models hand back aware datetimes; be safe with naive ones
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def redact_url(url: str) -> str:
    """A URL fit to print: no user or password."""
    return _CREDENTIALS.sub("***@", url)


def fields(data: dict[str, Any]) -> str:
    return " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in data.items()
                    if v is not None)


def event_line(event: Event) -> str:
    """One ledger event as rich markup (plain text when not on a terminal)."""
    return (f"  [dim]{utc_iso(event.at)}[/dim] [cyan]{event.kind}[/cyan] "
            f"{escape(fields(event.data))}").rstrip()


class Status(Protocol):
    def update(self, text: str) -> None: ...


class _NoStatus:
    def update(self, text: str) -> None:
        pass


class _RichStatus:
    def __init__(self, status: Any) -> None:
        self._status = status

    def update(self, text: str) -> None:
        self._status.update(escape(text))


@contextlib.contextmanager
def live_status(out: Console, text: str) -> Iterator[Status]:
    """A live progress line on a terminal; nothing at all when piped or redirected."""
    if not out.is_terminal:
        yield _NoStatus()
        return
    with out.status(escape(text)) as status:
        yield _RichStatus(status)


def _seconds(start: datetime, end: datetime | None) -> str:
    return "" if end is None else f" ({(end - start).total_seconds():.2f} s)"


def timeline(view: Any, events: Sequence[Event] | None) -> list[str]:
    """`playrun show`: the run, its attempts, then (unless events is None) its ledger with
    offsets from admission."""
    from tasks.cli.tracebacks import error_lines

    lines = [f"run [bold]{view.id}[/bold]  org {escape(view.org_id)}  play "
             f"{escape(view.play_path)}",
             f"  status [bold]{view.status}[/bold]"
             + (f"  code {view.code}" if view.code else "")
             + f"  created {utc_iso(view.created_at)}  finished {utc_iso(view.finished_at)}"
             + _seconds(view.created_at, view.finished_at)]
    if view.error:
        first, *more = error_lines(str(view.error), view.play_path) or [""]
        lines.append(f"  error {escape(first)}")
        lines.extend(f"    {escape(line)}" for line in more)
    if view.output is not None:
        lines.append(f"  output {escape(json.dumps(view.output, default=str))}")
    if view.deferral_count:
        lines.append(f"  deferred {view.deferral_count} time(s)")
    lines.append("attempts" if view.attempts else "attempts: none yet")
    for a in view.attempts:
        beat = (f"  last heartbeat {utc_iso(a.last_heartbeat_at)}"
                if a.last_heartbeat_at else "")
        due = f"  heartbeat due by {utc_iso(a.heartbeat_deadline)}" if a.heartbeat_deadline \
            else ""
        lines.append(f"  #{a.generation} {a.state}  sandbox {a.sandbox_id or '-'}  started "
                     f"{utc_iso(a.started_at)}  ended {utc_iso(a.ended_at)}"
                     f"{_seconds(a.started_at, a.ended_at)}{beat}{due}")
    if events is None:
        return lines
    lines.append("ledger")
    for e in events:
        offset = (e.at - view.created_at).total_seconds()
        lines.append(f"  [dim]{offset:+9.3f}s[/dim] {event_line(e).lstrip()}")
    return lines


def iso_or_none(value: Any) -> str | None:
    return utc_iso(value) if value is not None else None


def view_dict(view: Any) -> dict[str, Any]:
    """A run view as the JSON of `show --json` and `cancel`."""
    return {
        "id": view.id, "org_id": view.org_id, "status": view.status, "code": view.code,
        "error": view.error, "output": view.output, "created_at": utc_iso(view.created_at),
        "finished_at": iso_or_none(view.finished_at),
        "attempts": [{"generation": a.generation, "state": a.state, "sandbox_id": a.sandbox_id,
                      "started_at": utc_iso(a.started_at),
                      "ended_at": iso_or_none(a.ended_at),
                      "last_heartbeat_at": iso_or_none(a.last_heartbeat_at),
                      "heartbeat_deadline": iso_or_none(a.heartbeat_deadline)}
                     for a in view.attempts],
    }


def as_coded(exc: BaseException) -> PlayrunError | None:
    """Failures of the servers behind the CLI, as the one-line coded errors it prints;
    None for anything else (a bug, which keeps its traceback)."""
    import kombu.exceptions
    import redis
    import sqlalchemy.exc

    if isinstance(exc, PlayrunError):
        return exc
    if isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        from tasks.settings import get_settings

        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        return DatabaseUnavailableError(
            f"cannot reach the database at {redact_url(get_settings().database_url)}: "
            f"{reason} (is PLAYRUN_DATABASE_URL right, and `playrun db upgrade` run?)")
    if isinstance(exc, redis.RedisError | kombu.exceptions.OperationalError):
        from tasks.settings import get_settings

        settings = get_settings()
        url = settings.redis_url if isinstance(exc, redis.RedisError) \
            else settings.celery_broker_url
        what = "Redis" if url.startswith(("redis", "sentinel")) else "the broker"
        return BrokerUnavailableError(f"cannot reach {what} at {redact_url(url)}: {exc}")
    return None
