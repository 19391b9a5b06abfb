"""Start a whole playrun stack for tests: `Stack` (database, Redis, gateway, workers, beat),
`Child` (one managed subprocess) and its kinds. For pytest, the `playrun_stack` fixture:
`pytest_plugins = ["tasks.testing.pytest_plugin"]`. docs: README "Testing your plays"."""

from __future__ import annotations

from tasks.testing.child import Child
from tasks.testing.roles import Beat, Cli, Gateway, Worker
from tasks.testing.servers import PrivatePostgres, RedisServer
from tasks.testing.stack import Stack

__all__ = ["Beat", "Child", "Cli", "Gateway", "PrivatePostgres", "RedisServer", "Stack", "Worker"]
