"""pytest fixture `playrun_stack`: one Stack for the test session, closed at its end.

Enable it in a conftest.py (or a test module): `pytest_plugins = ["tasks.testing.pytest_plugin"]`.
By default SQLite and a private valkey-server (nothing to install or run); to test on your
own servers, `--playrun-database-url URL --playrun-redis-url URL` (or the ini options
playrun_database_url / playrun_redis_url). A database URL is used as it is: migrated to
the head revision, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tasks.testing.stack import Stack


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("playrun")
    for name, what in (
        ("database_url", "database URL (default: SQLite in a temp dir)"),
        ("redis_url", "Redis URL (default: a private valkey-server)"),
    ):
        group.addoption(
            f"--playrun-{name.replace('_', '-')}",
            dest=f"playrun_{name}",
            default=None,
            help=f"playrun_stack's {what}",
        )
        parser.addini(f"playrun_{name}", f"playrun_stack's {what}", default=None)


def _option(config: pytest.Config, name: str) -> str | None:
    value = config.getoption(name) or config.getini(name)
    return str(value) if value else None


@pytest.fixture(scope="session")
def playrun_session_stack(pytestconfig: pytest.Config) -> Iterator[Stack]:
    """The session's Stack (gateway, one worker, beat), started on first use."""
    with Stack(
        database=_option(pytestconfig, "playrun_database_url") or "sqlite",
        redis=_option(pytestconfig, "playrun_redis_url"),
        bind=False,
    ) as stack:
        yield stack


@pytest.fixture
def playrun_stack(playrun_session_stack: Stack) -> Iterator[Stack]:
    """The session's Stack, with tasks.submit_run, get_run, ... pointed at it during the
    test (and back after, so other tests keep their own settings)."""
    with playrun_session_stack.bound() as stack:
        yield stack
